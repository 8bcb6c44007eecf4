#include <lockstep/plan/batch_limit.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include <lockstep/core/error.h>
#include <lockstep/core/number_text.h>

namespace lockstep {

BatchLimit::BatchLimit(double fraction) : is_fraction_(true), fraction_(fraction) {
  LOCKSTEP_CHECK(std::isfinite(fraction) && fraction >= 0 && fraction <= 1, UsageError, "a batch limit of ", fraction,
                 ": a fraction must be in [0, 1] (1.0: every batch); for a count of batches pass an integer.");
}

BatchLimit::BatchLimit(int count) : BatchLimit(static_cast<int64_t>(count)) {}

BatchLimit::BatchLimit(int64_t count) : is_fraction_(false), fraction_(0), count_(count) {
  LOCKSTEP_CHECK(count >= 0, UsageError, "a batch limit of ", count,
                 " batches: a count must be 0 or more (0 skips the loop).");
}

BatchLimit BatchLimit::parse(const std::string& text, const std::string& flag) {
  const auto value = whole_number(text);
  // Lightning 2.6's val_check_interval also takes a time ("00:00:05:00"); Lockstep counts batches.
  LOCKSTEP_CHECK(text.find(':') == std::string::npos, UsageError, flag, " '", text, "': a time (DD:HH:MM:SS) is ",
                 "not available; pass a fraction of the epoch (0.25) or a batch count (10).");
  LOCKSTEP_CHECK(value && std::isfinite(*value), UsageError, flag, " '", text,
                 "' is neither a fraction (0.25) nor a batch count (10).");
  LOCKSTEP_CHECK(*value >= 0, UsageError, flag, " ", text, ": must be 0 or more: a fraction (0.25) or a batch count (10).");
  if (text.find_first_of(".eE") != std::string::npos) {
    LOCKSTEP_CHECK(*value <= 1.0, UsageError, flag, " ", text,
                   ": a fraction must be at most 1.0; for a count write an integer.");
    return BatchLimit(*value);
  }
  LOCKSTEP_CHECK(*value < 9.0e18, UsageError, flag, " ", text, ": too many batches to count; use a smaller count, ",
                 "or 1.0 for all of them.");
  return BatchLimit(static_cast<int64_t>(*value));
}

int64_t BatchLimit::of(int64_t available) const {
  if (is_fraction_) return static_cast<int64_t>(std::floor(fraction_ * static_cast<double>(available)));
  return std::min(count_, available);
}

std::string BatchLimit::str() const {
  if (!is_fraction_) return std::to_string(count_);
  std::ostringstream out;
  out << fraction_;
  std::string text = out.str();
  if (text.find_first_of(".eE") == std::string::npos) text += ".0";
  return text;
}

}  // namespace lockstep
