// Which examples a rank trains on under DDP (Lightning's use_distributed_sampler, the seed's
// replace_sampler_ddp): the Trainer puts a DistributedSampler on a loader unless the option is
// false or the loader has a sampler of its own. The strategy is rank 1 of 2 as the Trainer sees a
// DDP strategy (its distributed_sampler_kwargs), with the rest local.
#include <lockstep/trainer/trainer.h>

#include <cstdlib>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <lockstep/data/sampler.h>
#include <lockstep/distributed/rank_zero.h>
#include <lockstep/strategies/strategy.h>

#include "../../support/trainer_runs.h"

namespace lockstep {
namespace trainer_sampler_test {
namespace {

struct SecondOfTwoRanks : strategies::SingleDeviceStrategy {
  std::string name() const override { return "second_of_two_ranks"; }
  int world_size() const override { return 2; }
  int global_rank() const override { return 1; }
  std::optional<std::pair<int, int>> distributed_sampler_kwargs() const override { return std::make_pair(2, 1); }
};

// Records the examples it trains on: example i's one feature is i.
struct RecordsExamples : testing::Regressor {
  RecordsExamples() : Regressor(false, 1) {}
  torch::Tensor training_step(Batch& batch, int64_t batch_idx) override {
    for (int64_t i = 0; i < batch.data.size(0); ++i) seen.push_back(static_cast<int64_t>(batch.data[i][0].item<float>()));
    return Regressor::training_step(batch, batch_idx);
  }
  std::vector<int64_t> seen;
};

// 16 examples in batches of 4, in their own order (no shuffle).
std::shared_ptr<DataLoader> numbered_loader() {
  auto data = std::make_shared<TensorDataset>(torch::arange(16, torch::kFloat32).unsqueeze(1), torch::zeros({16, 1}));
  return std::make_shared<DataLoader>(data, DataLoaderOptions(4));
}

// The examples rank 1 of 2 trains on in one epoch of `loader`.
std::vector<int64_t> examples_seen(bool use_distributed_sampler, const std::shared_ptr<DataLoader>& loader) {
  testing::TempDir dir("lockstep_trainer_sampler");
  Trainer trainer(testing::quiet_options(dir).max_epochs(1).use_distributed_sampler(use_distributed_sampler));
  trainer.set_strategy(std::make_shared<SecondOfTwoRanks>());
  auto model = std::make_shared<RecordsExamples>();
  trainer.fit(model, loader);
  distributed::set_global_rank(0);  // launch() set this process's rank to the strategy's
  return model->seen;
}

using Indices = std::vector<int64_t>;

TEST(TrainerSampler, UnderDDPEachRankTrainsOnItsShare) {
  EXPECT_EQ(examples_seen(true, numbered_loader()), (Indices{1, 3, 5, 7, 9, 11, 13, 15}));
}

TEST(TrainerSampler, UseDistributedSamplerFalseKeepsTheLoadersOwnOrder) {
  auto loader = numbered_loader();
  EXPECT_EQ(examples_seen(false, loader), (Indices{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}));
  EXPECT_FALSE(loader->has_sampler());
}

TEST(TrainerSampler, ALoaderWithItsOwnSamplerIsLeftAlone) {
  auto loader = numbered_loader();
  loader->set_sampler(std::make_shared<distributed::DistributedSampler>(16, distributed::SamplerOptions(4, 2).shuffle(false)));
  EXPECT_EQ(examples_seen(true, loader), (Indices{2, 6, 10, 14})) << "the loader's sampler: rank 2 of 4";
}

// Rank 1 of 2 under `--seed seed`, 2 epochs of a shuffled loader without a seed of its own: the
// examples it trained on and the weights it ended with.
std::pair<Indices, std::vector<torch::Tensor>> run_with_seed(int64_t seed) {
  ::unsetenv("LOCKSTEP_GLOBAL_SEED");
  testing::TempDir dir("lockstep_trainer_seed");
  Trainer trainer(testing::quiet_options(dir).max_epochs(2).seed(seed));
  trainer.set_strategy(std::make_shared<SecondOfTwoRanks>());
  torch::manual_seed(0);
  auto model = std::make_shared<RecordsExamples>();
  auto data = std::make_shared<TensorDataset>(torch::arange(16, torch::kFloat32).unsqueeze(1), torch::rand({16, 1}));
  trainer.fit(model, std::make_shared<DataLoader>(data, DataLoaderOptions(4).shuffle(true)));
  distributed::set_global_rank(0);
  ::unsetenv("LOCKSTEP_GLOBAL_SEED");
  std::vector<torch::Tensor> weights;
  for (const auto& p : model->parameters()) weights.push_back(p.detach().clone());
  return {model->seen, weights};
}

// As Lightning's seed_everything reaches its DistributedSampler through PL_GLOBAL_SEED.
TEST(TrainerSeed, TwoSeedsReadTwoOrdersAndOneSeedTwiceIsBitIdentical) {
  const auto [one, one_weights] = run_with_seed(1);
  const auto [two, two_weights] = run_with_seed(2);
  const auto [again, again_weights] = run_with_seed(1);
  ASSERT_EQ(one.size(), 16u) << "8 examples in each of 2 epochs";
  EXPECT_NE(one, two) << "--seed 1 and --seed 2 read the data in the same order";
  EXPECT_EQ(one, again);
  ASSERT_EQ(one_weights.size(), again_weights.size());
  for (size_t k = 0; k < one_weights.size(); ++k) EXPECT_TRUE(torch::equal(one_weights[k], again_weights[k])) << k;
}

}  // namespace
}  // namespace trainer_sampler_test
}  // namespace lockstep
