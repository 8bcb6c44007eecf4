#pragma once
/// LearningRateMonitor: logs the learning rate of every optimizer and parameter group, as
/// Lightning's LearningRateMonitor does.

#include <map>
#include <string>
#include <vector>

#include <lockstep/callbacks/callback.h>
#include <lockstep/callbacks/lr_monitor_options.h>

namespace lockstep {

/// Names follow Lightning: "lr-SGD" for one optimizer with one group, "lr-Adam/pg1",
/// "lr-Adam/pg2" for several groups, "lr-Adam-1" for a second Adam. Values go to the trainer's
/// loggers (rank 0) at global step `trainer.global_step()` for epoch logging, and at the step
/// the optimizer step completes for step logging (the learning rate that step used), so they
/// share rows with the loss in metrics.csv. history() keeps every value on every rank.
///
///   trainer.add_callback(std::make_shared<lockstep::LearningRateMonitor>());  // lr-SGD per epoch
class LearningRateMonitor : public Callback {
 public:
  /// Throws UsageError for a logging_interval other than "", "step" or "epoch".
  explicit LearningRateMonitor(LearningRateMonitorOptions options = {});

  std::string name() const override { return "LearningRateMonitor"; }
  void on_fit_start(TrainerView& trainer, TrainingModule& module) override;
  void on_train_epoch_start(TrainerView& trainer, TrainingModule& module) override;
  void on_before_optimizer_step(TrainerView& trainer, TrainingModule& module) override;
  void on_train_batch_end(TrainerView& trainer, TrainingModule& module, const torch::Tensor& loss,
                          int64_t batch_idx) override;

  /// Every value logged so far, by name, in order.
  const std::map<std::string, std::vector<double>>& history() const { return history_; }
  /// The learning-rate names, one per optimizer and group, in order (known once fit started).
  const std::vector<std::string>& names() const { return names_; }

 private:
  /// Name -> value for every optimizer and group (and momentum, weight decay when asked).
  std::map<std::string, double> current_values(TrainerView& trainer) const;
  void record(TrainerView& trainer, int64_t step);

  LearningRateMonitorOptions options_;
  bool per_step_ = false;
  std::vector<std::string> names_;
  std::map<std::string, std::vector<double>> history_;
};

}  // namespace lockstep
