#pragma once
/// ReduceLROnPlateau: cuts the learning rate when a monitored metric stops improving, as
/// PyTorch's torch.optim.lr_scheduler.ReduceLROnPlateau does (LibTorch 1.13 has none; 2.x's keeps
/// its state private, so checkpoints could not hold it).

#include <string>
#include <vector>

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <torch/arg.h>
#include <torch/optim/schedulers/lr_scheduler.h>

namespace lockstep {

///   ReduceLROnPlateau(*sgd, ReduceLROnPlateauOptions().mode("min").factor(0.5).patience(2))
/// PyTorch's arguments and defaults.
struct ReduceLROnPlateauOptions {
  /// "min" (the metric should fall, as a loss) or "max" (rise, as an accuracy). Default: "min".
  TORCH_ARG(std::string, mode) = "min";
  /// Each cut multiplies the learning rate by this; below 1. Default: 0.1.
  TORCH_ARG(double, factor) = 0.1;
  /// Steps without improvement tolerated; the next one cuts. Default: 10.
  TORCH_ARG(int64_t, patience) = 10;
  /// How much better counts as better, relative or absolute (threshold_mode). Default: 1e-4.
  TORCH_ARG(double, threshold) = 1e-4;
  /// "rel" (better than best * (1 -/+ threshold)) or "abs" (best -/+ threshold). Default: "rel".
  TORCH_ARG(std::string, threshold_mode) = "rel";
  /// Steps after a cut during which bad steps are not counted. Default: 0.
  TORCH_ARG(int64_t, cooldown) = 0;
  /// The lowest learning rate of every parameter group. Default: 0.
  TORCH_ARG(double, min_lr) = 0.0;
  /// One lowest learning rate per parameter group, in order (instead of min_lr). Default: none.
  TORCH_ARG(std::vector<double>, min_lrs) = {};
  /// A cut smaller than this is not made. Default: 1e-8.
  TORCH_ARG(double, eps) = 1e-8;
};

/// Return it from configure_optimizers with the metric it watches; the Trainer calls step(value):
///   config.schedulers.push_back({std::make_shared<lockstep::ReduceLROnPlateau>(*sgd), "epoch", "val_loss"});
class ReduceLROnPlateau : public torch::optim::LRScheduler {
 public:
  /// Throws UsageError for a mode, threshold_mode, factor, patience, cooldown or min_lrs PyTorch
  /// would refuse.
  explicit ReduceLROnPlateau(torch::optim::Optimizer& optimizer, ReduceLROnPlateauOptions options = {});

  /// One step with the metric's value: counts it as better or bad, and cuts every group's
  /// learning rate by `factor` (not below its min_lr) after more than `patience` bad steps.
  void step(double metric);

  const ReduceLROnPlateauOptions& options() const { return options_; }
  /// The best value so far (+inf for "min", -inf for "max" before any step).
  double best() const { return best_; }
  int64_t num_bad_epochs() const { return num_bad_epochs_; }
  int64_t cooldown_counter() const { return cooldown_counter_; }
  /// Steps taken (PyTorch's last_epoch).
  int64_t last_epoch() const { return last_epoch_; }

  /// What checkpoints hold, under PyTorch's names: best, num_bad_epochs, cooldown_counter,
  /// last_epoch. The learning rates themselves are in the optimizer's state.
  c10::impl::GenericDict state_dict() const;
  void load_state_dict(const c10::impl::GenericDict& state);

 protected:
  /// The optimizer's rates unchanged: stepping without a metric (LRScheduler::step) does nothing.
  std::vector<double> get_lrs() override { return get_current_lrs(); }

 private:
  bool is_better(double value) const;

  torch::optim::Optimizer& optimizer_;
  ReduceLROnPlateauOptions options_;
  double best_;
  int64_t num_bad_epochs_ = 0;
  int64_t cooldown_counter_ = 0;
  int64_t last_epoch_ = 0;
};

}  // namespace lockstep
