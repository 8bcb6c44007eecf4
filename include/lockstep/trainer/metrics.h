#pragma once
/// MetricCollection: what TrainingModule::log records, reduced per step and per epoch as
/// Lightning's ResultCollection does (epoch values are batch-size-weighted means; with
/// sync_dist, the weighted mean over every rank's examples).

#include <functional>
#include <map>
#include <string>

#include <torch/types.h>

#include <lockstep/core/training_module.h>

namespace lockstep {

namespace strategies {
class Strategy;
}

/// "train", "validation", "test": the loop a value was logged in; it picks the defaults.
enum class Phase { train, validation, test };

class MetricCollection {
 public:
  /// Starts an epoch of `phase`: forgets that phase's epoch sums.
  void begin_epoch(Phase phase);
  /// Logs into `phase` again, keeping every phase's sums (training after a validation that ran
  /// within the training epoch, see val_check_interval).
  void set_phase(Phase phase) { phase_ = phase; }
  /// The number of examples of the current batch, the weight of its values in epoch means (0: a
  /// batch of the sampler's repeats only, whose values count nothing).
  void set_batch_size(int64_t batch_size) { batch_size_ = batch_size; }
  Phase phase() const { return phase_; }

  /// Records one value. `sync` reduces a step value across ranks at once (for sync_dist).
  void log(const std::string& name, double value, const LogOptions& options,
           const std::function<double(double)>& sync_step);

  /// The values logged on_step since the last call, under their logged names ("loss" or, when
  /// also on_epoch, "loss_step"); clears them.
  std::map<std::string, double> take_step_values();
  /// Latest step values, for the progress bar and callbacks.
  const std::map<std::string, double>& latest_step_values() const { return latest_step_; }
  /// Ends the epoch of the current phase: weighted means ("loss" or "loss_epoch"), reduced
  /// across ranks for sync_dist metrics with one all_reduce (through `strategy`).
  std::map<std::string, double> end_epoch(strategies::Strategy& strategy);
  /// The last training epoch's weighted mean of each value logged on_step only, by logged name
  /// (this rank's; a sync_dist value is reduced at each step): what the epoch's line shows.
  const std::map<std::string, double>& train_epoch_means() const { return train_epoch_means_; }
  /// Names shown on the progress bar.
  bool on_progress_bar(const std::string& logged_name) const;
  bool to_logger(const std::string& logged_name) const;

 private:
  struct EpochSum {
    double weighted_sum = 0;
    double weight = 0;
    bool sync = false;
    std::string logged_name;
  };
  Phase phase_ = Phase::train;
  int64_t batch_size_ = 1;
  static void add(EpochSum& sum, double value, int64_t weight);
  std::map<Phase, std::map<std::string, EpochSum>> epoch_;  // phase -> base name -> sums
  std::map<std::string, EpochSum> train_steps_;  // logged name -> sums of on_step-only training values
  std::map<std::string, double> train_epoch_means_;
  std::map<std::string, double> pending_step_;  // logged name -> value
  std::map<std::string, double> latest_step_;
  std::map<std::string, bool> prog_bar_;        // logged name -> shown
  std::map<std::string, bool> logger_;          // logged name -> sent to loggers
};

}  // namespace lockstep
