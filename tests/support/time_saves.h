#pragma once
// The rhythm of checkpoints by wall time in the tests of ModelCheckpoint's train_time_interval
// (tests/unit/callbacks/model_checkpoint_test.cpp, tests/unit/trainer/trainer_ddp_test.cpp).

#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace lockstep {
namespace testing {

/// Steps of at least 200 ms and train_time_interval 0.7 s. Four steps last at least 800 ms, so a
/// save comes at most 4 steps after the previous one (or after the fit's start): certain. Three
/// steps reach 0.7 s only with 33 ms of overhead a step (a save's own time counts towards the next
/// interval, as in Lightning), two only with 150 ms: a gap of 4, or 3 on a busy machine, never
/// fewer than 2. So `saves` (the global steps saved after `from`, up to `to`) must have gaps of 2
/// to 4 steps, and fewer than 4 steps after the last; the gaps are printed when they do not.
inline void expect_saves_every_0_7_seconds(const std::vector<int64_t>& saves, int64_t from, int64_t to) {
  std::string gaps;
  int64_t previous = from;
  for (int64_t step : saves) {
    gaps += std::to_string(step - previous) + " ";
    EXPECT_GE(step - previous, 2) << "saved after step " << step << "; gaps " << gaps;
    EXPECT_LE(step - previous, 4) << "saved after step " << step << "; gaps " << gaps;
    previous = step;
  }
  std::cout << "train_time_interval 0.7 s, steps of 200 ms: saved after steps";
  for (int64_t step : saves) std::cout << " " << step;
  std::cout << " of " << from + 1 << "-" << to << "\n";
  EXPECT_LT(to - previous, 4) << "no save in the last " << to - previous << " steps; gaps " << gaps;
  EXPECT_GE(saves.size(), static_cast<size_t>((to - from) / 4)) << gaps;
  EXPECT_LE(saves.size(), static_cast<size_t>((to - from) / 2)) << gaps;
}

}  // namespace testing
}  // namespace lockstep
