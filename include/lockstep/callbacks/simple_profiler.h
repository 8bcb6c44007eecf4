#pragma once
/// SimpleProfiler: call counts and durations per action, reported as Lightning's SimpleProfiler
/// table.

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include <lockstep/callbacks/profiler.h>

namespace lockstep {

/// Sums every action's calls; summary() is a table sorted by total time, with each action's
/// share of the wall time since the profiler was created (or reset):
///
///   FIT Profiler Report
///   ------------------------------------------------------------------------------------------
///   |  Action            |  Mean duration (s)  |  Num calls  |  Total time (s)  |  Percentage %  |
///   ------------------------------------------------------------------------------------------
///   |  Total             |  -                  |  1210       |  2.5013          |  100 %         |
///   |  training_step     |  0.00081            |  600        |  0.48600         |  19.430        |
///
/// The Trainer creates one when TrainerOptions::profiler is true; actions are "run_training_epoch",
/// "train_dataloader_next", "training_step", "backward", "optimizer_step", "validation",
/// "validation_step" and "[Callback]<name>.<hook>".
class SimpleProfiler : public Profiler {
 public:
  struct Stats {
    int64_t calls = 0;
    double total_seconds = 0;
    double min_seconds = 0;
    double max_seconds = 0;
    double mean_seconds() const { return calls > 0 ? total_seconds / static_cast<double>(calls) : 0.0; }
  };

  /// `title` heads the report ("FIT" gives "FIT Profiler Report"). Default: "FIT".
  explicit SimpleProfiler(std::string title = "FIT");

  void record(const std::string& action, double seconds) override;
  std::string summary() const override;

  /// A copy of the statistics, by action.
  std::map<std::string, Stats> stats() const;
  /// Seconds since construction or reset().
  double elapsed_seconds() const;
  /// Forgets everything and restarts the wall clock.
  void reset();

 private:
  std::string title_;
  // Guards stats_, so that scopes closing on different threads (the Trainer's, and any the
  // user profiles from) record safely.
  mutable std::mutex mutex_;
  std::map<std::string, Stats> stats_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace lockstep
