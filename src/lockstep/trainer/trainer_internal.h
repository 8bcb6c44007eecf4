#pragma once
// What trainer.cpp, loops.cpp and checkpointing.cpp share: the Trainer's own helpers, not installed.

#include <algorithm>
#include <cmath>
#include <string>

#include <torch/torch.h>

#include <lockstep/core/number_text.h>
#include <lockstep/core/error.h>
#include <lockstep/trainer/trainer.h>

namespace lockstep {
namespace detail {

// "1.0" (all), "0.25" (a fraction), "10" (a count) of `available` batches.
inline int64_t limit_batches(const std::string& limit, int64_t available, const std::string& flag) {
  const auto parsed = whole_number(limit);
  const double value = parsed.value_or(-1);
  if (value < 0) {
    throw UsageError("--" + flag + " '" + limit + "' is neither a fraction (0.25) nor a batch count (10).");
  }
  if (limit.find('.') != std::string::npos || limit.find('e') != std::string::npos) {
    if (value > 1.0) {
      throw UsageError("--" + flag + " " + limit + ": a fraction must be at most 1.0; for a count write an integer.");
    }
    return static_cast<int64_t>(std::floor(value * static_cast<double>(available)));
  }
  return std::min<int64_t>(static_cast<int64_t>(value), available);
}

}  // namespace detail

template <typename Fn>
void Trainer::each_callback(const char* hook, Fn&& fn) {
  for (auto& callback : callbacks_) {
    if (!profiler_) {
      fn(*callback);
      continue;
    }
    auto timed = profile("[Callback]" + callback->name() + "." + hook);
    fn(*callback);
  }
}

}  // namespace lockstep
