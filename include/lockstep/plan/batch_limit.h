#pragma once
/// BatchLimit: how many batches of an epoch to run, as a fraction of them (0.25) or a count (10),
/// as Lightning's limit_*_batches and val_check_interval take a float or an int.

#include <cstdint>
#include <string>

namespace lockstep {

///   TrainerOptions().limit_train_batches(0.25).limit_val_batches(10)
class BatchLimit {
 public:
  /// All batches (the fraction 1.0).
  BatchLimit() = default;
  /// A fraction in [0, 1] of the batches (a UsageError outside it).
  BatchLimit(double fraction);  // NOLINT: implicit, as Lightning takes a float
  /// A count of batches, 0 or more (a UsageError below 0).
  BatchLimit(int count);  // NOLINT: implicit, as Lightning takes an int
  BatchLimit(int64_t count);  // NOLINT
  /// "0.25" (a fraction: it has a '.' or an exponent) or "10" (a count); a UsageError naming
  /// `flag` ("--limit-train-batches") and the fix for anything else.
  static BatchLimit parse(const std::string& text, const std::string& flag);

  bool is_fraction() const { return is_fraction_; }
  double fraction() const { return fraction_; }
  int64_t count() const { return count_; }
  /// Of `available` batches: floor(fraction x available), or min(count, available).
  int64_t of(int64_t available) const;
  /// "0.25" or "10", as parse() reads it back.
  std::string str() const;
  bool operator==(const BatchLimit& other) const {
    return is_fraction_ == other.is_fraction_ && fraction_ == other.fraction_ && count_ == other.count_;
  }

 private:
  bool is_fraction_ = true;
  double fraction_ = 1.0;
  int64_t count_ = 0;
};

}  // namespace lockstep
