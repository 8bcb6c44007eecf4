// Which examples a rank trains on under DDP (Lightning's use_distributed_sampler, the seed's
// replace_sampler_ddp): the Trainer puts a DistributedSampler on a loader unless the option is
// false or the loader has a sampler of its own. The strategy is rank 1 of 2 as the Trainer sees a
// DDP strategy (its distributed_sampler_kwargs), with the rest local.
#include <lockstep/trainer/trainer.h>

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

}  // namespace
}  // namespace trainer_sampler_test
}  // namespace lockstep
