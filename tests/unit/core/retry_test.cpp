#include <lockstep/core/retry.h>

#include <stdexcept>
#include <vector>

#include <gtest/gtest.h>

namespace lockstep {
namespace {

struct Busy : std::runtime_error {
  Busy() : std::runtime_error("busy") {}
};

// Records the waits instead of sleeping; `draw` is the jitter (1.0: the largest wait allowed).
BackoffOptions recorded(std::vector<double>& waits, double draw = 1.0) {
  return BackoffOptions().sleep([&waits](double s) { waits.push_back(s); }).uniform([draw] { return draw; });
}

TEST(RetryJitteredBackoff, ReturnsTheFirstSuccessWithoutWaiting) {
  std::vector<double> waits;
  int calls = 0;
  EXPECT_EQ(retry_jittered_backoff<Busy>([&] { return ++calls * 10; }, recorded(waits)), 10);
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(waits.empty());
}

TEST(RetryJitteredBackoff, RetriesUntilItSucceedsWaitingAfterEachFailure) {
  std::vector<double> waits;
  int calls = 0;
  const int result = retry_jittered_backoff<Busy>(
      [&] {
        if (++calls < 3) throw Busy();
        return calls;
      },
      recorded(waits));
  EXPECT_EQ(result, 3);
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(waits, (std::vector<double>{0.01, 0.02})) << "base_delay, then doubled";
}

TEST(RetryJitteredBackoff, RethrowsAfterTheLastTryAndDoesNotWaitAfterIt) {
  for (int retries : {1, 2, 5, 7}) {
    std::vector<double> waits;
    int calls = 0;
    EXPECT_THROW(retry_jittered_backoff<Busy>([&]() -> int { ++calls; throw Busy(); },
                                              recorded(waits).retries(retries)),
                 Busy);
    EXPECT_EQ(calls, retries);
    EXPECT_EQ(static_cast<int>(waits.size()), retries - 1) << "retries=" << retries;
  }
  std::vector<double> waits;
  int calls = 0;
  EXPECT_THROW(retry_jittered_backoff<Busy>([&]() -> int { ++calls; throw Busy(); }, recorded(waits)), Busy);
  EXPECT_EQ(calls, 5) << "default: 5 tries, as the seed";
  EXPECT_EQ(waits, (std::vector<double>{0.01, 0.02, 0.04, 0.08}));
}

TEST(RetryJitteredBackoff, WaitsGrowExponentiallyUpToTheCap) {
  std::vector<double> waits;
  EXPECT_THROW(retry_jittered_backoff<Busy>([]() -> int { throw Busy(); },
                                            recorded(waits).retries(8).base_delay(0.1).cap_delay(1.0)),
               Busy);
  const std::vector<double> envelope{0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0};
  ASSERT_EQ(waits.size(), envelope.size());
  for (size_t i = 0; i < waits.size(); ++i) EXPECT_DOUBLE_EQ(waits[i], envelope[i]) << "wait " << i;
}

TEST(RetryJitteredBackoff, JitterScalesEachWaitWithinItsEnvelope) {
  // With the default random jitter, every wait lies in [0, min(cap, base * 2^i)].
  std::vector<double> waits;
  auto options = BackoffOptions().retries(12).base_delay(0.05).cap_delay(0.3).sleep([&](double s) { waits.push_back(s); });
  EXPECT_THROW(retry_jittered_backoff<Busy>([]() -> int { throw Busy(); }, options), Busy);
  ASSERT_EQ(waits.size(), 11u);
  for (size_t i = 0; i < waits.size(); ++i) {
    EXPECT_GE(waits[i], 0.0) << "wait " << i;
    EXPECT_LE(waits[i], std::min(0.3, 0.05 * (1 << i))) << "wait " << i;
  }
  // A fixed draw scales the envelope: half of it.
  std::vector<double> halves;
  EXPECT_THROW(retry_jittered_backoff<Busy>([]() -> int { throw Busy(); }, recorded(halves, 0.5).retries(3)), Busy);
  EXPECT_EQ(halves, (std::vector<double>{0.005, 0.01}));
}

TEST(RetryJitteredBackoff, OtherErrorsPassThroughAtOnce) {
  std::vector<double> waits;
  int calls = 0;
  EXPECT_THROW(retry_jittered_backoff<Busy>([&]() -> int { ++calls; throw std::logic_error("bug"); }, recorded(waits)),
               std::logic_error);
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(waits.empty());
}

}  // namespace
}  // namespace lockstep
