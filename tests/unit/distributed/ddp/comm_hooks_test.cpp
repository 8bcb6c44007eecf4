#include <lockstep/distributed/ddp/comm_hooks.h>

#include <cmath>
#include <iomanip>
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
using lockstep::testing::max_difference;
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
double train_with_hook(int world, const CommHook& hook, double tolerance, bool view = false, bool shared_memory = true) {
  torch::set_num_threads(1);
  const auto init = initial_parameters();
  const ParityData data(kSteps, world * kPerRank);
  const auto expected = train_reference(init, data);
  Worst worst;
  run_ranks(world, [&](ProcessGroup& g) {
    ParityMlp model;
    if (g.rank() == 0) copy_into(model->parameters(), init);
    DistributedDataParallel ddp(model, g, DDPOptions().comm_hook(hook).gradient_as_bucket_view(view)
                                              .shared_memory(shared_memory).bucket_cap_mb(0.0005).first_bucket_mb(0.0002));
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

// Each rank's own gradients of step 0 (its rows of the batch), computed in one process.
std::vector<std::vector<at::Tensor>> local_gradients(int world) {
  torch::set_num_threads(1);
  const auto init = initial_parameters();
  const ParityData data(1, world * kPerRank);
  std::vector<std::vector<at::Tensor>> gradients;
  for (int r = 0; r < world; ++r) {
    ParityMlp model;
    copy_into(model->parameters(), init);
    torch::mse_loss(model(data.input(0, r, kPerRank)), data.target(0, r, kPerRank)).backward();
    gradients.emplace_back();
    for (const auto& p : model->parameters()) gradients.back().push_back(p.grad().clone());
  }
  return gradients;
}

// The gradients after one synchronised backward of step 0 through `hook`, as rank 0 has them
// (every rank has the same bits), and the transport DDP chose.
struct Reduced {
  std::vector<at::Tensor> gradients;
  std::string transport;
  std::string why_not_shared_memory;
};

Reduced reduce_once(int world, const CommHook& hook, bool shared_memory) {
  torch::set_num_threads(1);
  const auto init = initial_parameters();
  const ParityData data(1, world * kPerRank);
  Reduced reduced;
  run_ranks(world, [&](ProcessGroup& g) {
    ParityMlp model;
    if (g.rank() == 0) copy_into(model->parameters(), init);
    DistributedDataParallel ddp(model, g, DDPOptions().comm_hook(hook).shared_memory(shared_memory)
                                              .bucket_cap_mb(0.0005).first_bucket_mb(0.0002));
    torch::mse_loss(ddp(data.input(0, g.rank(), kPerRank)), data.target(0, g.rank(), kPerRank)).backward();
    for (const auto& p : model->parameters()) {
      auto gathered = all_gather_stacked(g, p.grad());
      EXPECT_TRUE(gathered[0].equal(gathered[g.rank()])) << "rank " << g.rank() << " differs from rank 0";
    }
    if (g.rank() != 0) return;
    reduced.transport = ddp.reducer().transport().name();
    reduced.why_not_shared_memory = ddp.why_not_shared_memory();
    for (const auto& p : model->parameters()) reduced.gradients.push_back(p.grad().clone());
  });
  return reduced;
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

TEST_P(CommHooks, CompressionOverGlooIsCloseToFp32) {
  const double fp16 = train_with_hook(GetParam(), fp16_compress_hook(), 5e-4, false, /*shared_memory=*/false);
  const double bf16 = train_with_hook(GetParam(), bf16_compress_hook(), 3e-3, true, /*shared_memory=*/false);
  std::cout << "[ hook ] over gloo, world " << GetParam() << ": fp16_compress max |diff| " << fp16
            << ", bf16_compress " << bf16 << "\n";
}

// fp16_compress_hook on ranks that share memory: DDP keeps shared memory, and the mean is, bit
// for bit, one process's average of the ranks' gradients rounded to float16, summed in float32 in
// rank order. Over Gloo the float16 values are divided first and summed in float16, so the two
// paths differ by a few float16 roundings: at most (world + 2) * 2^-11 of the largest gradient.
TEST_P(CommHooks, Fp16OverSharedMemorySumsInRankOrder) {
  const int world = GetParam();
  const auto local = local_gradients(world);
  const auto shared = reduce_once(world, fp16_compress_hook(), true);
  EXPECT_EQ(shared.transport, "shared memory");
  EXPECT_EQ(shared.why_not_shared_memory, "");
  const auto gloo = reduce_once(world, fp16_compress_hook(), false);
  EXPECT_EQ(gloo.transport, "gloo");
  double largest = 0;
  for (const auto& rank : local) {
    for (const auto& g : rank) largest = std::max(largest, g.abs().max().item<double>());
  }
  const double tolerance = (world + 2) * std::ldexp(largest, -11);
  const auto names = parameter_names(*ParityMlp());
  for (size_t k = 0; k < names.size(); ++k) {
    auto expected = local[0][k].to(at::kHalf).to(at::kFloat);
    for (int r = 1; r < world; ++r) expected.add_(local[r][k].to(at::kHalf).to(at::kFloat));
    expected.div_(world);
    const auto bits = max_difference(shared.gradients[k], expected);
    EXPECT_TRUE(shared.gradients[k].equal(expected))
        << names[k] << "[" << bits.index << "]: " << std::setprecision(10) << bits.actual << " in shared memory, "
        << bits.expected << " averaged in one process";
    const auto paths = max_difference(shared.gradients[k], gloo.gradients[k]);
    EXPECT_LE(paths.max_abs, tolerance) << names[k] << "[" << paths.index << "]: " << paths.actual
                                        << " in shared memory, " << paths.expected << " over gloo";
  }
}

// bf16_compress_hook sums the same bfloat16 values in float32 in rank order either way.
TEST_P(CommHooks, Bf16GivesTheSameBitsInSharedMemoryAndOverGloo) {
  const auto shared = reduce_once(GetParam(), bf16_compress_hook(), true);
  const auto gloo = reduce_once(GetParam(), bf16_compress_hook(), false);
  EXPECT_EQ(shared.transport, "shared memory");
  const auto names = parameter_names(*ParityMlp());
  for (size_t k = 0; k < names.size(); ++k) {
    const auto d = max_difference(shared.gradients[k], gloo.gradients[k]);
    EXPECT_TRUE(shared.gradients[k].equal(gloo.gradients[k]))
        << names[k] << "[" << d.index << "]: " << std::setprecision(10) << d.actual << " in shared memory, "
        << d.expected << " over gloo";
  }
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

// A transport that records the reductions asked of it and leaves the buffer as it is.
class RecordingTransport : public GradientTransport {
 public:
  std::string name() const override { return "recording"; }
  at::Tensor allocate(size_t /*bucket*/, int64_t numel, const at::TensorOptions& options) override {
    return torch::zeros({numel}, options);
  }
  BucketFuture allreduce_mean(size_t bucket, const at::Tensor& buffer, double divisor) override {
    calls.push_back("allreduce_mean bucket " + std::to_string(bucket) + " / " + std::to_string(divisor));
    return buffer;
  }
  BucketFuture allreduce_mean_compressed(size_t bucket, const at::Tensor& buffer, double divisor,
                                         at::ScalarType compressed) override {
    calls.push_back("allreduce_mean_compressed " + std::string(c10::toString(compressed)) + " bucket " +
                    std::to_string(bucket) + " / " + std::to_string(divisor));
    return buffer;
  }
  std::vector<std::string> calls;
};

// Every built-in hook reduces through the bucket's transport (the one DDP chose), none around it.
TEST(CommHook, TheBuiltInHooksReduceThroughTheBucketsTransport) {
  run_ranks(2, [](ProcessGroup& g) {
    auto transport = std::make_shared<RecordingTransport>();
    GradBucket bucket(3, true, torch::ones({4}), {}, {}, {});
    bucket.set_transport(transport);
    for (const auto& hook : {allreduce_mean_hook(), fp16_compress_hook(), bf16_compress_hook()}) {
      EXPECT_TRUE(hook(g, bucket).wait(std::chrono::seconds(20)).equal(torch::ones({4})));
    }
    const std::vector<std::string> expected = {"allreduce_mean bucket 3 / 2.000000",
                                               "allreduce_mean_compressed Half bucket 3 / 2.000000",
                                               "allreduce_mean_compressed BFloat16 bucket 3 / 2.000000"};
    EXPECT_EQ(transport->calls, expected) << "rank " << g.rank();
  });
}

}  // namespace
}  // namespace comm_hooks_test
}  // namespace distributed
}  // namespace lockstep
