#pragma once
/// EarlyStopping: ends fit when a monitored metric stops improving, as Lightning's EarlyStopping.

#include <optional>
#include <string>

#include <lockstep/callbacks/callback.h>
#include <lockstep/callbacks/early_stopping_options.h>

namespace lockstep {

/// After each epoch (after its validation), compares the monitored metric with the best so far:
/// an improvement by more than min_delta resets the count, anything else adds one, and at
/// `patience` the trainer is asked to stop after this epoch. A non-finite value, a value past
/// stopping_threshold (good enough) or past divergence_threshold (hopeless) stops at once. Every
/// rank decides on its own value and the ranks agree through reduce_boolean_decision (one rank
/// that stops stops all), so they end at the same epoch. wait_count, best_score and
/// stopped_epoch are saved in checkpoints. When it stops, rank 0 prints one line on stderr, e.g.
///   lockstep: EarlyStopping stopped training at epoch 7 (monitor val_loss, mode min, best 0.123,
///   patience 3): Monitored metric val_loss did not improve in the last 3 records. Best score: 0.123.
/// (verbose(true) prints every check before it as well).
///
///   trainer.add_callback(std::make_shared<lockstep::EarlyStopping>(
///       lockstep::EarlyStoppingOptions("val_loss").patience(3).min_delta(0.01)));
class EarlyStopping : public Callback {
 public:
  /// Throws UsageError for a mode other than min|max or a negative patience.
  explicit EarlyStopping(EarlyStoppingOptions options);

  /// "EarlyStopping{'monitor': 'val_loss', 'mode': 'min'}", as Lightning's state key.
  std::string name() const override;

  void on_fit_start(TrainerView& trainer, TrainingModule& module) override;
  void on_fit_end(TrainerView& trainer, TrainingModule& module) override;
  void on_validation_end(TrainerView& trainer, TrainingModule& module) override;
  void on_train_epoch_end(TrainerView& trainer, TrainingModule& module) override;

  /// {"wait_count", "stopped_epoch", "best_score", "patience"}.
  c10::IValue state_dict() const override;
  void load_state_dict(const c10::IValue& state) override;

  const EarlyStoppingOptions& options() const { return options_; }
  /// Checks in a row without improvement.
  int64_t wait_count() const { return wait_count_; }
  /// The best value so far (+inf for min, -inf for max before the first check).
  double best_score() const { return best_score_; }
  /// The epoch in which it asked the trainer to stop; 0 if it did not.
  int64_t stopped_epoch() const { return stopped_epoch_; }
  /// Why it stopped (or the last improvement), in words; "" before the first check.
  const std::string& reason() const { return reason_; }

 private:
  void check(TrainerView& trainer);
  /// The line rank 0 prints when it stops: the epoch, the metric, its best, the patience, why
  /// (`mine`: this rank's value asked to stop, not only another rank's).
  std::string stop_line(bool mine) const;
  /// Updates the best score and count with `current`; true when training should stop.
  bool evaluate(double current);
  bool better(double a, double b) const;

  EarlyStoppingOptions options_;
  bool fitting_ = false;
  bool on_train_epoch_end_ = true;
  int64_t wait_count_ = 0;
  int64_t stopped_epoch_ = 0;
  double best_score_;
  std::string reason_;
};

}  // namespace lockstep
