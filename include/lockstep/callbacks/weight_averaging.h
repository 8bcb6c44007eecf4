#pragma once
/// WeightAveraging and EMAWeightAveraging: an average of the model's weights kept beside them
/// during fit, as Lightning's callbacks of these names (torch.optim.swa_utils.AveragedModel).

#include <map>
#include <optional>
#include <string>

#include <lockstep/callbacks/callback.h>
#include <lockstep/callbacks/weight_averaging_options.h>

namespace lockstep {

/// Keeps an average of the module's parameters (and buffers, with use_buffers) and updates it
/// after every optimizer step (should_update decides; a subclass changes when). The average
/// replaces the weights during each validation in fit, and the training weights come back
/// after it; at the end of fit the module keeps the average (Lightning's on_train_end).
///
/// The average lives where the weights live and as the strategy holds them (TrainerView's
/// local_weights): whole on each rank under one process and DDP (the replicas are equal, so each
/// averages its own, with no communication), this rank's pieces under FSDP. Checkpoints carry
/// it under callbacks/<name()>: "n_averaged", "latest_update_step", "latest_update_epoch" and
/// "state_dict" (the average by parameter name, whole in a full checkpoint, each rank's pieces
/// in a sharded one; --fsdp-state-dict-type dcp refuses it by name), so a resumed run keeps
/// averaging as if never stopped. The checkpoint's own state_dict holds the training weights.
///
///   trainer.add_callback(std::make_shared<lockstep::WeightAveraging>(
///       lockstep::WeightAveragingOptions().avg_fn(lockstep::get_ema_avg_fn(0.99))));
class WeightAveraging : public Callback {
 public:
  explicit WeightAveraging(WeightAveragingOptions options = {});

  std::string name() const override { return "WeightAveraging"; }

  void on_fit_start(TrainerView& trainer, TrainingModule& module) override;
  void on_fit_end(TrainerView& trainer, TrainingModule& module) override;
  void on_train_batch_end(TrainerView& trainer, TrainingModule& module, const torch::Tensor& loss,
                          int64_t batch_idx) override;
  void on_train_epoch_end(TrainerView& trainer, TrainingModule& module) override;
  void on_validation_start(TrainerView& trainer, TrainingModule& module) override;
  void on_validation_end(TrainerView& trainer, TrainingModule& module) override;
  void on_exception(TrainerView& trainer, TrainingModule& module, const std::exception& error) override;

  /// {"n_averaged", "latest_update_step", "latest_update_epoch", "state_dict"}; a collective
  /// under FSDP (every rank makes the checkpoint's state there).
  c10::IValue state_dict() const override;
  void load_state_dict(const c10::IValue& state) override;

  /// Whether to update after optimizer step `step_idx` (0-based; given after a step) or at the
  /// end of epoch `epoch_idx` (given then). Here: after every step, never at epoch ends.
  virtual bool should_update(std::optional<int64_t> step_idx, std::optional<int64_t> epoch_idx) const;

  /// The average by name, laid out as TrainerView::local_weights (empty before the first update).
  const std::map<std::string, torch::Tensor>& average() const { return average_; }
  /// How many values the average holds.
  int64_t n_averaged() const { return n_averaged_; }
  /// The global step after which it last updated (0: never).
  int64_t latest_update_step() const { return latest_update_step_; }

 protected:
  /// Whether validation in fit runs on the average (Lightning's StochasticWeightAveraging does not).
  virtual bool swaps_for_validation() const { return true; }
  /// The average takes the module's current weights.
  void update(TrainerView& trainer, TrainingModule& module);
  /// A subclass's own state, beside the base's in state_dict.
  virtual void save_extra(c10::impl::GenericDict& state) const {}
  virtual void load_extra(const c10::impl::GenericDict& state) {}

 private:
  void swap_back(TrainerView& trainer);

  WeightAveragingOptions options_;
  TrainerView* trainer_ = nullptr;  // from on_fit_start: checkpoints lay the average out through it
  std::map<std::string, torch::Tensor> average_;
  int64_t n_averaged_ = 0;
  int64_t latest_update_step_ = 0;
  int64_t latest_update_epoch_ = -1;
  std::optional<c10::impl::GenericDict> loaded_;   // a checkpoint's state, until fit starts
  std::map<std::string, torch::Tensor> training_;  // the training weights while validating on the average
};

/// The exponential moving average of the weights (Lightning's EMAWeightAveraging): after each
/// optimizer step with index i (0-based), when i >= update_starting_at_step (if set) and i is a
/// multiple of update_every_n_steps, average = decay * average + (1 - decay) * weights (the
/// first update copies); also at the end of each epoch from update_starting_at_epoch, if set.
///
///   trainer.add_callback(std::make_shared<lockstep::EMAWeightAveraging>(
///       lockstep::EMAWeightAveragingOptions().decay(0.999)));
class EMAWeightAveraging : public WeightAveraging {
 public:
  /// Throws UsageError for a decay outside [0, 1] or a negative update_every_n_steps.
  explicit EMAWeightAveraging(EMAWeightAveragingOptions options = {});

  std::string name() const override { return "EMAWeightAveraging"; }
  bool should_update(std::optional<int64_t> step_idx, std::optional<int64_t> epoch_idx) const override;
  const EMAWeightAveragingOptions& options() const { return options_; }

 private:
  EMAWeightAveragingOptions options_;
};

}  // namespace lockstep
