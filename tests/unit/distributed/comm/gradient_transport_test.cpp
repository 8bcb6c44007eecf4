#include <lockstep/distributed/comm/gradient_transport.h>

#include <cmath>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <lockstep/core/error.h>
#include <lockstep/distributed/comm/c10d_transport.h>

#include "../../../support/thread_ranks.h"

namespace lockstep {
namespace distributed {
namespace gradient_transport_test {
namespace {

using testing::run_ranks;

TEST(GradientTransport, TheChoiceFollowsTheOptionsOnEveryRank) {
  run_ranks(2, [](ProcessGroup& g) {
    const std::vector<at::Tensor> params{torch::ones({4}, torch::requires_grad())};
    std::string why_not = "unset";
    EXPECT_EQ(choose_gradient_transport(g, params, true, &why_not)->name(), "shared memory");
    EXPECT_EQ(why_not, "");
    auto gloo = choose_gradient_transport(g, params, false, &why_not);
    EXPECT_EQ(gloo->name(), "gloo");
    EXPECT_FALSE(gloo->reduces_through_bucket_memory());
    EXPECT_NE(why_not.find("turned off in DDPOptions"), std::string::npos) << why_not;
  });
  run_ranks(1, [](ProcessGroup& g) {
    std::string why_not;
    EXPECT_EQ(choose_gradient_transport(g, {torch::ones({1})}, true, &why_not)->name(), "gloo");
    EXPECT_EQ(why_not, "a single rank has nothing to share");
  });
}

// Both transports give each bucket zeroed memory and average it (or a stand-in of its size);
// shared memory starts each bucket on a cache line and reuses the slot for a new layout.
class Transports : public ::testing::TestWithParam<bool> {};

// Shared memory, chosen as DDP chooses it (for 16 float32 values), or Gloo.
std::shared_ptr<GradientTransport> transport_for(ProcessGroup& g, bool shared) {
  std::string why_not;
  auto transport = shared ? choose_gradient_transport(g, {torch::ones({16})}, true, &why_not)
                          : std::make_shared<C10dTransport>(g);
  EXPECT_EQ(transport->name(), shared ? "shared memory" : "gloo") << why_not;
  return transport;
}

TEST_P(Transports, AllocateAndAverageBuckets) {
  const bool shared = GetParam();
  run_ranks(3, [shared](ProcessGroup& g) {
    auto transport = transport_for(g, shared);
    auto first = transport->allocate(0, 3, torch::kFloat32);
    auto second = transport->allocate(1, 5, torch::kFloat64);
    EXPECT_TRUE(first.eq(0).all().item<bool>());
    EXPECT_EQ(second.scalar_type(), torch::kFloat64);
    if (shared) {
      EXPECT_EQ(static_cast<char*>(second.data_ptr()) - static_cast<char*>(first.data_ptr()), 64);
    }
    const double r = g.rank();
    first.fill_(r);
    second.fill_(2 * r);
    auto a = transport->allreduce_mean(0, first, 3);
    auto b = transport->allreduce_mean(1, second, 3);
    EXPECT_TRUE(a.wait(std::chrono::seconds(20)).eq(1.0).all().item<bool>());  // (0+1+2)/3
    EXPECT_TRUE(b.wait(std::chrono::seconds(20)).eq(2.0).all().item<bool>());
    auto stand_in = torch::full({3}, r, torch::kFloat32);
    EXPECT_TRUE(transport->allreduce_mean(0, stand_in, 3).wait(std::chrono::seconds(20)).eq(1.0).all().item<bool>());
    auto again = transport->allocate(0, 3, torch::kFloat32);  // a rebuilt layout
    if (shared) EXPECT_EQ(again.data_ptr(), first.data_ptr());
    EXPECT_TRUE(again.eq(0).all().item<bool>());
  });
}

// The compression hooks' mean rounds each rank's values first (1 + 2^-20 and 3 + 2^-20 are 1 and
// 3 in float16 and bfloat16, whose mean, 2, every path computes exactly) and ends in the buffer;
// a dtype that is not 16-bit is refused before anything is sent.
TEST_P(Transports, CompressedMeanRoundsEachRanksValuesFirst) {
  const bool shared = GetParam();
  run_ranks(2, [shared](ProcessGroup& g) {
    auto transport = transport_for(g, shared);
    auto bucket = transport->allocate(0, 5, torch::kFloat32);
    try {
      transport->allreduce_mean_compressed(0, bucket, 2, at::kFloat);
      ADD_FAILURE() << "float32 accepted as a compressed dtype";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("float16 or bfloat16, not Float"), std::string::npos) << e.what();
    }
    for (const auto dtype : {at::kHalf, at::kBFloat16}) {
      bucket.fill_(1.0 + std::ldexp(1.0, -20) + 2 * g.rank());
      auto mean = transport->allreduce_mean_compressed(0, bucket, 2, dtype).wait(std::chrono::seconds(20));
      EXPECT_TRUE(mean.eq(2.0).all().item<bool>()) << dtype << " rank " << g.rank() << ": " << mean;
      EXPECT_TRUE(bucket.eq(2.0).all().item<bool>()) << dtype << " rank " << g.rank() << ": " << bucket;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(SharedMemoryAndGloo, Transports, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "shared_memory" : "gloo"; });

}  // namespace
}  // namespace gradient_transport_test
}  // namespace distributed
}  // namespace lockstep
