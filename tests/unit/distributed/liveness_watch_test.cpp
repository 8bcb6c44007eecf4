// The liveness watch on ranks played by watches over one in-memory store: a rank that never
// beats is found within the bound, the verdict reaches the other ranks, and a rank that leaves on
// purpose is not lost. tests/unit/trainer/trainer_faults_test.cpp freezes real processes.
#include "../../../src/lockstep/distributed/liveness_watch.h"

#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

namespace lockstep {
namespace distributed {
namespace liveness_watch_test {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// The verdicts a watch gave, and when.
struct Verdicts {
  std::mutex mutex;
  std::vector<std::string> messages;
  Clock::time_point first{};
  std::function<void(const std::string&)> sink() {
    return [this](const std::string& message) {
      std::lock_guard<std::mutex> lock(mutex);
      if (messages.empty()) first = Clock::now();
      messages.push_back(message);
    };
  }
  size_t count() {
    std::lock_guard<std::mutex> lock(mutex);
    return messages.size();
  }
};

std::unique_ptr<detail::LivenessWatch> watch(const c10::intrusive_ptr<c10d::Store>& store, int rank, int world,
                                             Verdicts& verdicts, std::chrono::milliseconds bound = 600ms) {
  return std::make_unique<detail::LivenessWatch>(store, rank, world, bound, std::vector<std::string>{},
                                                 "rank " + std::to_string(rank) + "/" + std::to_string(world),
                                                 "the test's store", verdicts.sink());
}

void wait_for_verdicts(Verdicts& verdicts, size_t n, std::chrono::milliseconds at_most) {
  const auto deadline = Clock::now() + at_most;
  while (verdicts.count() < n && Clock::now() < deadline) std::this_thread::sleep_for(10ms);
}

TEST(LivenessWatch, ARankThatNeverBeatsIsFoundWithinTheBoundAndEveryLiveRankHearsIt) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  Verdicts zero, one;
  const auto start = Clock::now();
  auto rank0 = watch(store, 0, 3, zero);
  auto rank1 = watch(store, 1, 3, one);  // rank 2 never starts
  wait_for_verdicts(zero, 1, 10s);
  wait_for_verdicts(one, 1, 10s);
  ASSERT_EQ(zero.count(), 1u);
  ASSERT_EQ(one.count(), 1u);
  const double after = std::chrono::duration<double>(zero.first - start).count();
  EXPECT_GE(after, 0.6);
  EXPECT_LT(after, 0.6 + 3 * 0.1 + 1.0) << "the bound, a few periods of 0.1 s, and slack";
  EXPECT_EQ(zero.messages[0].rfind("rank 0/3: rank 2 stopped answering: no heartbeat for 0.6 s (liveness timeout "
                                   "0.6 s). Its host may be gone or its process frozen; this rank ends (exit code 1)",
                                   0), 0u) << zero.messages[0];
  EXPECT_EQ(one.messages[0].rfind("rank 1/3: rank 0 found that rank 2 stopped answering", 0), 0u) << one.messages[0];
}

TEST(LivenessWatch, RanksThatBeatOrLeaveOnPurposeAreNotLost) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  Verdicts zero, one, two;
  auto rank0 = watch(store, 0, 3, zero);
  auto rank1 = watch(store, 1, 3, one);
  auto rank2 = watch(store, 2, 3, two);
  std::this_thread::sleep_for(1s);
  rank2.reset();  // its group destroyed: the job goes on without it
  std::this_thread::sleep_for(2s);  // more than three bounds
  EXPECT_EQ(zero.count(), 0u) << zero.messages.front();
  EXPECT_EQ(one.count(), 0u) << one.messages.front();
}

TEST(LivenessWatch, RankZeroSilentIsFoundByTheOthers) {
  // As under torchrun, where the store lives in the agent and outlives a frozen rank 0.
  auto store = c10::make_intrusive<c10d::HashStore>();
  Verdicts one;
  auto rank1 = watch(store, 1, 2, one);
  wait_for_verdicts(one, 1, 10s);
  ASSERT_EQ(one.count(), 1u);
  EXPECT_EQ(one.messages[0].rfind("rank 1/2: rank 0 stopped answering: no heartbeat for 0.6 s", 0), 0u)
      << one.messages[0];
}

}  // namespace liveness_watch_test
}  // namespace distributed
}  // namespace lockstep
