#pragma once
/// Callback: code that runs at points of the Trainer's loops (checkpoints, early stopping,
/// progress bars). Override only the hooks you need; each runs on every rank.

#include <exception>
#include <string>

#include <ATen/core/ivalue.h>
#include <torch/types.h>

#include <lockstep/core/batch.h>
#include <lockstep/core/trainer_view.h>

namespace lockstep {

class TrainingModule;

class Callback {
 public:
  virtual ~Callback() = default;
  /// Unique name, the key of this callback's state in checkpoints.
  virtual std::string name() const = 0;

  virtual void on_fit_start(TrainerView& trainer, TrainingModule& module) {}
  virtual void on_fit_end(TrainerView& trainer, TrainingModule& module) {}
  virtual void on_train_epoch_start(TrainerView& trainer, TrainingModule& module) {}
  /// After the epoch's training batches and its validation, with epoch metrics available.
  virtual void on_train_epoch_end(TrainerView& trainer, TrainingModule& module) {}
  virtual void on_train_batch_end(TrainerView& trainer, TrainingModule& module, const torch::Tensor& loss,
                                  int64_t batch_idx) {}
  virtual void on_validation_start(TrainerView& trainer, TrainingModule& module) {}
  virtual void on_validation_batch_end(TrainerView& trainer, TrainingModule& module, int64_t batch_idx) {}
  virtual void on_validation_end(TrainerView& trainer, TrainingModule& module) {}
  virtual void on_test_end(TrainerView& trainer, TrainingModule& module) {}
  /// Just before an optimizer step (gradients are synchronised and clipped).
  virtual void on_before_optimizer_step(TrainerView& trainer, TrainingModule& module) {}

  /// When fit ends by an exception once it started (after on_fit_start), before the exception
  /// goes on; on each rank that raised it. Other ranks may be stuck in a collective or gone, so
  /// call none (TrainerView::save_checkpoint_alone writes without one).
  virtual void on_exception(TrainerView& trainer, TrainingModule& module, const std::exception& error) {}

  /// State saved in checkpoints and restored on resume.
  virtual c10::IValue state_dict() const { return c10::IValue(); }
  virtual void load_state_dict(const c10::IValue& state) {}
};

}  // namespace lockstep
