#pragma once
/// StochasticWeightAveraging: the equal-weight average of the weights of the last epochs, with
/// SWA's learning rate schedule, as Lightning's callback of this name (Izmailov et al., 2018).

#include <vector>

#include <lockstep/callbacks/weight_averaging.h>

namespace lockstep {

/// From epoch swa_start (0-based: swa_epoch_start's epoch counted from 1, minus one), the
/// learning rate of each parameter group of the (one) optimizer goes from its value then, lr0,
/// to swa_lrs over annealing_epochs, as torch's SWALR: in epoch swa_start + k it is
/// swa_lr * a + lr0 * (1 - a), a = anneal(min(1, k / annealing_epochs)) (cos: (1 - cos(pi t)) / 2,
/// linear: t; 1 at once with annealing_epochs 0). It is set before every optimizer step, so it
/// takes the place of the optimizer's schedulers (Lightning swaps the first one out). At the end
/// of each epoch from swa_start the parameters join their equal-weight average (buffers are not
/// averaged); at the end of fit the module keeps the average and, where it has batch norm
/// layers, their running statistics are computed afresh for it over the training data (one pass
/// of training_step without backward or step; TrainerView::forward_training_batches).
/// Validation during fit runs on the training weights, as Lightning's. Unlike Lightning, which
/// updates at the start of each epoch from swa_start (averaging the weights from before that
/// epoch and not those of the last one), the average takes each epoch's result as it ends.
///
///   trainer.add_callback(std::make_shared<lockstep::StochasticWeightAveraging>(
///       lockstep::StochasticWeightAveragingOptions(0.01).swa_epoch_start(0.75).annealing_epochs(2)));
class StochasticWeightAveraging : public WeightAveraging {
 public:
  /// Throws UsageError for no swa_lrs or one not above 0, a swa_epoch_start not above 0 (or 1 or
  /// more and not an integer), a negative annealing_epochs or a strategy other than cos|linear.
  explicit StochasticWeightAveraging(StochasticWeightAveragingOptions options);

  std::string name() const override { return "StochasticWeightAveraging"; }
  /// Also refuses (UsageError) several optimizers, swa_lrs of another count than the optimizer's
  /// parameter groups, and a fraction without --max-epochs.
  void on_fit_start(TrainerView& trainer, TrainingModule& module) override;
  void on_fit_end(TrainerView& trainer, TrainingModule& module) override;
  void on_train_epoch_start(TrainerView& trainer, TrainingModule& module) override;
  void on_before_optimizer_step(TrainerView& trainer, TrainingModule& module) override;
  bool should_update(std::optional<int64_t> step_idx, std::optional<int64_t> epoch_idx) const override;

  /// The first epoch (0-based) of SWA's schedule and average (known once fit started).
  int64_t swa_start() const { return swa_start_; }
  /// The learning rate of parameter group `group` in epoch `epoch` (from swa_start on).
  double swa_lr_at(int64_t epoch, size_t group) const;
  const StochasticWeightAveragingOptions& options() const { return options_; }

 protected:
  bool swaps_for_validation() const override { return false; }
  void save_extra(c10::impl::GenericDict& state) const override;
  void load_extra(const c10::impl::GenericDict& state) override;

 private:
  void set_learning_rates(TrainerView& trainer);

  StochasticWeightAveragingOptions options_;
  int64_t swa_start_ = 0;
  std::vector<double> lr0_;  // each group's learning rate when SWA's schedule began
};

}  // namespace lockstep
