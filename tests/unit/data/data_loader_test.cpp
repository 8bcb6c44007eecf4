#include <lockstep/data/data_loader.h>

#include <cstdlib>
#include <optional>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <lockstep/core/error.h>
#include <lockstep/core/seed.h>

namespace lockstep {
namespace {

std::shared_ptr<TensorDataset> numbers(int64_t n) {
  return std::make_shared<TensorDataset>(torch::arange(n, torch::kFloat32).unsqueeze(1), torch::arange(n));
}

TEST(DataLoader, BatchesInOrderWithLastPartialBatch) {
  for (bool prefetch : {false, true}) {
    DataLoader loader(numbers(10), DataLoaderOptions(4).prefetch(prefetch));
    ASSERT_EQ(loader.num_batches(), 3);
    std::vector<int64_t> targets;
    for (int64_t i = 0; i < loader.num_batches(); ++i) {
      Batch b = loader.batch(i);
      EXPECT_EQ(b.data.size(1), 1);
      for (int64_t j = 0; j < b.size(); ++j) targets.push_back(b.target[j].item<int64_t>());
    }
    EXPECT_EQ(targets, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})) << "prefetch " << prefetch;
  }
}

TEST(DataLoader, DropLastAndShuffleBySeedAndEpoch) {
  DataLoader a(numbers(10), DataLoaderOptions(4).drop_last(true).shuffle(true).seed(5));
  DataLoader b(numbers(10), DataLoaderOptions(4).drop_last(true).shuffle(true).seed(5));
  EXPECT_EQ(a.num_batches(), 2);
  EXPECT_TRUE(a.batch(0).target.equal(b.batch(0).target));
  auto first = a.batch(0).target.clone();
  a.set_epoch(1);
  EXPECT_FALSE(a.batch(0).target.equal(first));
}

std::vector<int64_t> order_of(DataLoader& loader) {
  std::vector<int64_t> order;
  for (int64_t i = 0; i < loader.num_batches(); ++i) {
    const auto target = loader.batch(i).target;
    order.insert(order.end(), target.data_ptr<int64_t>(), target.data_ptr<int64_t>() + target.numel());
  }
  return order;
}

std::vector<int64_t> order_with(std::optional<int64_t> seed) {
  DataLoader loader(numbers(20), DataLoaderOptions(8).shuffle(true).seed(seed));
  return order_of(loader);
}

// As Lightning's samplers take PL_GLOBAL_SEED: a loader without a seed shuffles by the global one
// (seed_everything, --seed), 0 without one; a loader's own seed wins.
TEST(DataLoaderSeed, TheGlobalSeedShufflesALoaderWithoutASeedOfItsOwn) {
  ::unsetenv("LOCKSTEP_GLOBAL_SEED");
  EXPECT_EQ(order_with(std::nullopt), order_with(0));
  seed_everything(1);
  const auto one = order_with(std::nullopt);
  EXPECT_EQ(DataLoader(numbers(4), DataLoaderOptions(2)).seed(), 1);
  seed_everything(2);
  const auto two = order_with(std::nullopt);
  EXPECT_NE(one, two);
  EXPECT_EQ(two, order_with(2));
  const auto own = order_with(5);
  ::unsetenv("LOCKSTEP_GLOBAL_SEED");
  EXPECT_EQ(own, order_with(5));
  EXPECT_EQ(order_with(std::nullopt), order_with(0));
}

TEST(DataLoader, SamplerGivesThisRanksShare) {
  auto loader_for = [](int rank) {
    auto loader = std::make_unique<DataLoader>(numbers(9), DataLoaderOptions(2));
    loader->set_sampler(std::make_shared<distributed::DistributedSampler>(
        9, distributed::SamplerOptions(2, rank).shuffle(false)));
    return loader;
  };
  auto r0 = loader_for(0), r1 = loader_for(1);
  EXPECT_EQ(r0->num_batches(), 3);  // 5 padded indices per rank, batches of 2
  EXPECT_TRUE(r0->batch(0).target.equal(torch::tensor({0, 2}, torch::kInt64)));
  EXPECT_TRUE(r1->batch(0).target.equal(torch::tensor({1, 3}, torch::kInt64)));
  EXPECT_TRUE(r1->batch(2).target.equal(torch::tensor({0}, torch::kInt64)));  // padding repeats index 0
}

// `for (Batch& batch : loader)`, as Python's `for batch in loader`: the batches batch(i) gives.
TEST(DataLoader, RangeForReadsTheEpochsBatches) {
  for (bool prefetch : {false, true}) {
    DataLoader loader(numbers(10), DataLoaderOptions(4).shuffle(true).seed(2).prefetch(prefetch));
    loader.set_epoch(1);
    std::vector<int64_t> seen;
    int64_t batches = 0;
    for (Batch& batch : loader) {
      ++batches;
      for (int64_t j = 0; j < batch.size(); ++j) seen.push_back(batch.target[j].item<int64_t>());
    }
    EXPECT_EQ(batches, 3);
    EXPECT_EQ(seen, order_of(loader)) << "prefetch " << prefetch;
    EXPECT_NE(seen, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})) << "shuffled";
    auto it = loader.begin();
    ++it;
    EXPECT_EQ(it.index(), 1);
    EXPECT_TRUE(it->target.equal(loader.batch(1).target));
  }
  DataLoader empty_epoch(numbers(3), DataLoaderOptions(4).drop_last(true));
  EXPECT_TRUE(empty_epoch.begin() == empty_epoch.end());
}

// Rank 1 of 3 over 10 examples with batches of 3: indices 1, 4, 7 and 0, the last a repeat.
TEST(DataLoader, BatchIndicesAndTheSamplersPadding) {
  DataLoader loader(numbers(10), DataLoaderOptions(3));
  EXPECT_EQ(loader.batch_indices(3), (std::vector<int64_t>{9}));
  EXPECT_EQ(loader.padding_in_batch(3), 0) << "no sampler";
  auto sampler = std::make_shared<distributed::DistributedSampler>(10, distributed::SamplerOptions(3, 1).shuffle(false));
  loader.set_sampler(sampler);
  EXPECT_EQ(loader.sampler(), sampler);
  ASSERT_EQ(loader.num_batches(), 2);
  EXPECT_EQ(loader.batch_indices(0), (std::vector<int64_t>{1, 4, 7}));
  EXPECT_EQ(loader.batch_indices(1), (std::vector<int64_t>{0}));
  EXPECT_EQ(loader.padding_in_batch(0), 0);
  EXPECT_EQ(loader.padding_in_batch(1), 1);
  DataLoader pairs(numbers(10), DataLoaderOptions(2));
  pairs.set_sampler(std::make_shared<distributed::DistributedSampler>(10, distributed::SamplerOptions(3, 2).shuffle(false)));
  EXPECT_EQ(pairs.batch_indices(1), (std::vector<int64_t>{8, 1}));
  EXPECT_EQ(pairs.padding_in_batch(1), 1);
  EXPECT_EQ(pairs.padding_in_batch(0), 0);
  EXPECT_THROW(pairs.padding_in_batch(2), UsageError);
  EXPECT_THROW(pairs.batch_indices(-1), UsageError);
}

// The batch-size finder's setter: the next batches have the new size, the prefetched one too.
TEST(DataLoader, SetBatchSizeAppliesToTheNextBatches) {
  auto data = std::make_shared<TensorDataset>(torch::arange(10).unsqueeze(1).to(torch::kFloat32), torch::arange(10));
  DataLoader loader(data, DataLoaderOptions(4));
  EXPECT_EQ(loader.batch(0).size(), 4);  // batch 1 is being prepared at size 4
  loader.set_batch_size(3);
  EXPECT_EQ(loader.num_batches(), 4);
  EXPECT_EQ(loader.batch(1).size(), 3);
  EXPECT_EQ(loader.batch(1).target[0].item<int64_t>(), 3);
  EXPECT_EQ(loader.batch(3).size(), 1);
  EXPECT_THROW(loader.set_batch_size(0), UsageError);
}

TEST(DataLoader, BadInput) {
  EXPECT_THROW(DataLoader(numbers(3), DataLoaderOptions(0)), UsageError);
  EXPECT_THROW(DataLoader(nullptr, DataLoaderOptions(1)), UsageError);
  EXPECT_THROW(TensorDataset(torch::zeros({3, 2}), torch::zeros({4})), UsageError);
  DataLoader loader(numbers(3), DataLoaderOptions(2));
  try {
    loader.batch(2);
    ADD_FAILURE() << "batch 2 of 2: no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("index 2 is outside [0, 2)"), std::string::npos) << e.what();
  }
}

TEST(Batch, ToDeviceRecursesIntoContainers) {
  std::map<std::string, std::vector<torch::Tensor>> nested{{"a", {torch::ones({1}), torch::zeros({2})}}};
  std::tuple<Batch, std::pair<torch::Tensor, torch::Tensor>> t{Batch{torch::ones({2}), torch::Tensor()},
                                                                {torch::ones({1}), torch::ones({1})}};
  to_device(nested, torch::Device(torch::kCPU));
  to_device(t, torch::Device(torch::kCPU));
  EXPECT_EQ(nested["a"][1].device().type(), torch::kCPU);
  EXPECT_FALSE(std::get<0>(t).target.defined());
}

}  // namespace
}  // namespace lockstep
