#include <lockstep/distributed/ddp/comm_hooks.h>

#include <mutex>

#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/torch.h>

#include <lockstep/distributed/collectives.h>
#include <lockstep/distributed/ddp/ddp.h>

#include "../../../support/parity.h"
#include "../../../support/thread_ranks.h"

namespace lockstep {
namespace distributed {
namespace comm_hooks_test {
namespace {

using lockstep::testing::clone_all;
using lockstep::testing::copy_into;
using lockstep::testing::ParityData;
using lockstep::testing::ParityMlp;
using lockstep::testing::parameter_names;
using lockstep::testing::parameters_close;
using lockstep::testing::run_ranks;

constexpr int kSteps = 5;
constexpr int64_t kPerRank = 4;

using lockstep::testing::Worst;

std::vector<at::Tensor> initial_parameters() {
  torch::manual_seed(11);
  ParityMlp model;
  return clone_all(model->parameters());
}

std::vector<at::Tensor> train_reference(const std::vector<at::Tensor>& init, const ParityData& data) {
  ParityMlp model;
  copy_into(model->parameters(), init);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int s = 0; s < kSteps; ++s) {
    opt.zero_grad();
    torch::mse_loss(model(data.inputs[s]), data.targets[s]).backward();
    opt.step();
  }
  return clone_all(model->parameters());
}

// Trains with `hook` on `world` ranks; returns the largest difference to the reference.
double train_with_hook(int world, const CommHook& hook, double tolerance, bool view = false) {
  torch::set_num_threads(1);
  const auto init = initial_parameters();
  const ParityData data(kSteps, world * kPerRank);
  const auto expected = train_reference(init, data);
  Worst worst;
  run_ranks(world, [&](ProcessGroup& g) {
    ParityMlp model;
    if (g.rank() == 0) copy_into(model->parameters(), init);
    DistributedDataParallel ddp(model, g, DDPOptions().comm_hook(hook).gradient_as_bucket_view(view)
                                              .bucket_cap_mb(0.0005).first_bucket_mb(0.0002));
    torch::optim::SGD opt(ddp.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    for (int s = 0; s < kSteps; ++s) {
      opt.zero_grad();
      torch::mse_loss(ddp(data.input(s, g.rank(), kPerRank)), data.target(s, g.rank(), kPerRank)).backward();
      opt.step();
    }
    double w = 0;
    EXPECT_TRUE(parameters_close(model->parameters(), expected, tolerance, parameter_names(*model), &w))
        << "rank " << g.rank();
    worst.update(w);
    // Replicas stay identical to each other, bit for bit.
    for (const auto& p : model->parameters()) {
      auto gathered = all_gather_stacked(g, p.detach());
      EXPECT_TRUE(gathered[0].equal(gathered[g.rank()])) << "rank " << g.rank() << " drifted from rank 0";
    }
  });
  return worst.value;
}

class CommHooks : public ::testing::TestWithParam<int> {};

TEST_P(CommHooks, DefaultAllreduceMeanMatchesTheWholeBatch) {
  const double worst = train_with_hook(GetParam(), allreduce_mean_hook(), 1e-6);
  std::cout << "[ hook ] allreduce_mean world " << GetParam() << ": max |diff| " << worst << "\n";
}

TEST_P(CommHooks, Fp16CompressIsCloseToFp32) {
  const double worst = train_with_hook(GetParam(), fp16_compress_hook(), 5e-4);
  std::cout << "[ hook ] fp16_compress world " << GetParam() << ": max |diff| " << worst << "\n";
  EXPECT_GT(worst, 0.0) << "fp16 compression should not be exact";
}

TEST_P(CommHooks, Bf16CompressIsCloseToFp32) {
  const double worst = train_with_hook(GetParam(), bf16_compress_hook(), 3e-3, /*view=*/true);
  std::cout << "[ hook ] bf16_compress world " << GetParam() << ": max |diff| " << worst << "\n";
  EXPECT_GT(worst, 0.0) << "bf16 compression should not be exact";
}

TEST_P(CommHooks, UserHookSeesBucketsInOrderAndMayReduceSynchronously) {
  const int world = GetParam();
  std::mutex mutex;
  std::vector<std::vector<size_t>> calls(world);
  std::vector<std::vector<std::vector<std::string>>> names(world);
  auto hook = [&](ProcessGroup& group, const GradBucket& bucket) -> BucketFuture {
    {
      std::lock_guard<std::mutex> lock(mutex);
      calls[group.rank()].push_back(bucket.index());
      names[group.rank()].push_back(bucket.parameter_names());
    }
    EXPECT_EQ(bucket.parameters().size(), bucket.gradients().size());
    int64_t total = 0;
    for (const auto& g : bucket.gradients()) total += g.numel();
    EXPECT_EQ(total, bucket.buffer().numel());
    // Blocking: the reduced tensor is returned at once.
    return all_reduce(group, bucket.buffer().clone(), ReduceOp::mean);
  };
  const double worst = train_with_hook(world, hook, 1e-6);
  std::cout << "[ hook ] user synchronous world " << world << ": max |diff| " << worst << "\n";
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(calls[r].size() % 3, 0u) << "3 buckets per step";
    for (size_t k = 0; k < calls[r].size(); ++k) EXPECT_EQ(calls[r][k], k % 3) << "rank " << r << " call " << k;
    EXPECT_EQ(names[r][0], (std::vector<std::string>{"fc3.bias", "fc3.weight"}));
  }
}

TEST_P(CommHooks, UserHookMayReturnAFuture) {
  auto hook = [](ProcessGroup& group, const GradBucket& bucket) -> BucketFuture {
    std::vector<at::Tensor> tensors{bucket.buffer()};
    auto work = group.backend()->allreduce(tensors);
    const int n = group.world_size();
    return BucketFuture(work->getFuture(), [n](const at::Tensor& sum) { return sum / n; });
  };
  const double worst = train_with_hook(GetParam(), hook, 1e-6);
  std::cout << "[ hook ] user future world " << GetParam() << ": max |diff| " << worst << "\n";
}

INSTANTIATE_TEST_SUITE_P(World, CommHooks, ::testing::Values(2, 4));

TEST(CommHook, AWrongSizedResultIsAClearError) {
  torch::set_num_threads(1);
  std::mutex mutex;
  std::vector<std::string> messages;
  run_ranks(2, [&](ProcessGroup& g) {
    ParityMlp model;
    DistributedDataParallel ddp(model, g, DDPOptions().comm_hook([](ProcessGroup&, const GradBucket& bucket) -> BucketFuture {
      return torch::zeros({bucket.buffer().numel() + 1});
    }));
    try {
      ddp(torch::randn({2, 8})).sum().backward();
      ADD_FAILURE() << "no error";
    } catch (const DistributedError& e) {
      std::lock_guard<std::mutex> lock(mutex);
      messages.push_back(e.what());
    }
  });
  ASSERT_EQ(messages.size(), 2u);
  EXPECT_NE(messages[0].find("the comm hook returned 485 values for bucket 0 (params: fc3.bias"), std::string::npos)
      << messages[0];
}

TEST(CommHook, AFailingHookNamesTheBucket) {
  torch::set_num_threads(1);
  run_ranks(1, [&](ProcessGroup& g) {
    ParityMlp model;
    DistributedDataParallel ddp(model, g, DDPOptions().comm_hook([](ProcessGroup&, const GradBucket&) -> BucketFuture {
      throw std::runtime_error("boom");
    }));
    try {
      ddp(torch::randn({2, 8})).sum().backward();
      ADD_FAILURE() << "no error";
    } catch (const DistributedError& e) {
      EXPECT_NE(std::string(e.what()).find("comm hook failed to start reducing bucket 0"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("boom"), std::string::npos) << e.what();
    }
  });
}

}  // namespace
}  // namespace comm_hooks_test
}  // namespace distributed
}  // namespace lockstep
