#include <lockstep/distributed/ddp/reducer.h>

#include <mutex>

#include <gtest/gtest.h>

#include <lockstep/core/error.h>
#include <torch/torch.h>

#include <lockstep/distributed/bucket_assignment.h>
#include <lockstep/distributed/comm/c10d_transport.h>
#include <lockstep/distributed/ddp/ddp.h>

#include "../../../support/parity.h"
#include "../../../support/thread_ranks.h"

namespace lockstep {
namespace distributed {
namespace {

using lockstep::testing::run_ranks;
using Buckets = std::vector<std::vector<size_t>>;

std::vector<at::Tensor> floats(const std::vector<int64_t>& sizes, at::ScalarType dtype = at::kFloat) {
  std::vector<at::Tensor> out;
  for (int64_t n : sizes) out.push_back(torch::zeros({n}, dtype));
  return out;
}

std::string show(const Buckets& buckets) {
  std::ostringstream out;
  for (const auto& b : buckets) {
    out << "{";
    for (size_t k = 0; k < b.size(); ++k) out << (k ? "," : "") << b[k];
    out << "}";
  }
  return out.str();
}

TEST(BucketAssignment, ReverseOrderInOneBucketWhenEverythingFits) {
  const auto buckets = assign_buckets(floats({10, 20, 30}), reverse_order(3), 1 << 20, 25 << 20);
  EXPECT_EQ(buckets, (Buckets{{2, 1, 0}})) << show(buckets);
}

TEST(BucketAssignment, FirstBucketIsSmallerThanTheOthers) {
  // 100 floats = 400 bytes each; the first bucket closes at 400 bytes, the others at 800.
  const auto buckets = assign_buckets(floats({100, 100, 100, 100, 100, 100}), reverse_order(6), 400, 800);
  EXPECT_EQ(buckets, (Buckets{{5}, {4, 3}, {2, 1}, {0}})) << show(buckets);
}

TEST(BucketAssignment, ABucketClosesOnceItReachesTheCap) {
  // 50 + 60 floats = 440 bytes >= 400: closes after the tensor that crosses the cap.
  const auto buckets = assign_buckets(floats({10, 60, 50}), reverse_order(3), 400, 400);
  EXPECT_EQ(buckets, (Buckets{{2, 1}, {0}})) << show(buckets);
}

TEST(BucketAssignment, TinyCapGivesOneBucketPerTensor) {
  const auto buckets = assign_buckets(floats({3, 1, 4, 1}), reverse_order(4), 1, 1);
  EXPECT_EQ(buckets, (Buckets{{3}, {2}, {1}, {0}})) << show(buckets);
}

TEST(BucketAssignment, OneDtypePerBucketOrderedByFirstMember) {
  auto tensors = floats({10, 10, 10, 10});
  tensors[1] = torch::zeros({10}, torch::kDouble);
  tensors[2] = torch::zeros({10}, torch::kDouble);
  const auto buckets = assign_buckets(tensors, reverse_order(4), 1 << 20, 1 << 20);
  EXPECT_EQ(buckets, (Buckets{{3, 0}, {2, 1}})) << show(buckets);
  // Each dtype's first bucket gets the small cap: 10 doubles = 80 bytes reach it, 10 floats do not.
  const auto small = assign_buckets(tensors, reverse_order(4), 80, 1 << 20);
  EXPECT_EQ(small, (Buckets{{3, 0}, {2}, {1}})) << show(small);
}

TEST(BucketAssignment, FollowsTheGivenOrder) {
  const auto buckets = assign_buckets(floats({100, 100, 100}), {1, 0, 2}, 400, 800);
  EXPECT_EQ(buckets, (Buckets{{1}, {0, 2}})) << show(buckets);
}

TEST(BucketAssignment, RejectsAnOrderThatIsNotAPermutation) {
  EXPECT_THROW(assign_buckets(floats({1, 1}), {0, 0}, 1, 1), UsageError);
  EXPECT_THROW(assign_buckets(floats({1, 1}), {0}, 1, 1), UsageError);
  EXPECT_THROW(assign_buckets(floats({1, 1}), {0, 2}, 1, 1), UsageError);
}

// `late` is registered first but used last in forward, so its gradients arrive first.
struct ReorderedImpl : torch::nn::Module {
  ReorderedImpl()
      : late(register_module("late", torch::nn::Linear(6, 2))), early(register_module("early", torch::nn::Linear(4, 6))) {}
  torch::Tensor forward(const torch::Tensor& x) { return late(torch::relu(early(x))); }
  torch::nn::Linear late, early;
};
TORCH_MODULE(Reordered);

TEST(Reducer, RebuildsBucketsOnceFromTheArrivalOrderOfTheFirstStep) {
  torch::set_num_threads(1);
  run_ranks(2, [](ProcessGroup& g) {
    Reordered model;
    DistributedDataParallel ddp(model, g, DDPOptions().bucket_cap_mb(1e-7).first_bucket_mb(1e-7));
    // Parameters: 0 late.weight, 1 late.bias, 2 early.weight, 3 early.bias; reverse order first.
    EXPECT_EQ(ddp.reducer().bucket_indices(), (Buckets{{3}, {2}, {1}, {0}}));
    torch::optim::SGD opt(ddp.parameters(), 0.1);
    for (int step = 0; step < 3; ++step) {
      opt.zero_grad();
      ddp.forward(torch::randn({3, 4})).sum().backward();
      opt.step();
      const auto buckets = ddp.reducer().bucket_indices();
      if (step == 0) {
        EXPECT_EQ(buckets, (Buckets{{3}, {2}, {1}, {0}})) << "rebuilt before the second forward";
      } else {
        // `late` first now: its gradients come first in backward.
        ASSERT_EQ(buckets.size(), 4u);
        EXPECT_LE(buckets[0][0], 1u) << show(buckets);
        EXPECT_LE(buckets[1][0], 1u) << show(buckets);
      }
    }
    // With the rebuilt order the first bucket is launched as soon as it is ready.
    const auto& trace = ddp.last_trace();
    EXPECT_EQ(trace.buckets[0].launched.count() >= trace.buckets[0].ready.count(), true);
    EXPECT_LT(trace.buckets[0].launched.count(), trace.backward_end.count());
  });
}

// What DistributedDataParallel gives its reducer (shared memory between these thread ranks).
std::shared_ptr<GradientTransport> transport_for(ProcessGroup& g, const std::vector<at::Tensor>& params) {
  std::string why_not;
  return choose_gradient_transport(g, params, /*shared_memory=*/true, &why_not);
}

TEST(Reducer, RejectsParametersThatDoNotRequireGrad) {
  run_ranks(1, [](ProcessGroup& g) {
    auto p = torch::zeros({3});
    auto transport = std::make_shared<C10dTransport>(g);
    EXPECT_THROW(Reducer({p}, {"p"}, g, DDPOptions(), transport), UsageError);
    auto q = torch::zeros({3}, torch::requires_grad());
    EXPECT_THROW(Reducer({q}, {"q", "extra"}, g, DDPOptions(), transport), UsageError);
    EXPECT_THROW(Reducer({q}, {"q"}, g, DDPOptions(), nullptr), UsageError);
  });
}

TEST(Reducer, AveragesGradientsOfAHandBuiltParameterList) {
  torch::set_num_threads(1);
  run_ranks(4, [](ProcessGroup& g) {
    auto a = torch::ones({5}, torch::requires_grad());
    auto b = torch::ones({2, 3}, torch::requires_grad());
    Reducer reducer({a, b}, {"a", "b"}, g, DDPOptions().bucket_cap_mb(1e-7).first_bucket_mb(1e-7),
                    transport_for(g, {a, b}));
    reducer.prepare_for_forward();
    const float r = static_cast<float>(g.rank());
    auto loss = (a * r).sum() + (b * (r * 2)).sum();
    reducer.prepare_for_backward({loss}, true);
    loss.backward();
    // mean over ranks of r = 1.5.
    EXPECT_TRUE(a.grad().eq(1.5).all().item<bool>()) << a.grad();
    EXPECT_TRUE(b.grad().eq(3.0).all().item<bool>()) << b.grad();
  });
}

TEST(Reducer, StaticGraphFindsUnusedParametersOnceAndKeepsRebuilding) {
  torch::set_num_threads(1);
  run_ranks(2, [](ProcessGroup& g) {
    auto used = torch::ones({4}, torch::requires_grad());
    auto unused = torch::ones({4}, torch::requires_grad());
    Reducer reducer({used, unused}, {"used", "unused"}, g,
                    DDPOptions().static_graph(true).bucket_cap_mb(1e-7).first_bucket_mb(1e-7),
                    transport_for(g, {used, unused}));
    for (int step = 0; step < 3; ++step) {
      reducer.prepare_for_forward();
      auto loss = (used * static_cast<float>(g.rank() + 1)).sum();
      reducer.prepare_for_backward({loss}, true);
      EXPECT_EQ(reducer.unused_parameter_names(), std::vector<std::string>{"unused"}) << "step " << step;
      used.mutable_grad() = at::Tensor();
      loss.backward();
      EXPECT_TRUE(used.grad().eq(1.5).all().item<bool>()) << used.grad();
      EXPECT_FALSE(unused.grad().defined());
    }
  });
}

}  // namespace
}  // namespace distributed
}  // namespace lockstep
