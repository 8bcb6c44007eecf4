#include <lockstep/callbacks/lr_monitor.h>

#include <typeinfo>

#include <c10/util/Type.h>
#include <torch/optim.h>

#include <lockstep/core/training_module.h>
#include <lockstep/core/error.h>

namespace lockstep {
namespace {

// "SGD" for torch::optim::SGD, as Python's optimizer.__class__.__name__.
std::string class_name(const torch::optim::Optimizer& optimizer) {
  const std::string full = c10::demangle(typeid(optimizer).name());
  const auto colon = full.rfind("::");
  return colon == std::string::npos ? full : full.substr(colon + 2);
}

// Momentum (SGD, RMSprop) or beta1 (Adam, AdamW); 0 for optimizers without one.
double momentum(const torch::optim::OptimizerOptions& options) {
  if (auto* sgd = dynamic_cast<const torch::optim::SGDOptions*>(&options)) return sgd->momentum();
  if (auto* adam = dynamic_cast<const torch::optim::AdamOptions*>(&options)) return std::get<0>(adam->betas());
  if (auto* adamw = dynamic_cast<const torch::optim::AdamWOptions*>(&options)) return std::get<0>(adamw->betas());
  if (auto* rms = dynamic_cast<const torch::optim::RMSpropOptions*>(&options)) return rms->momentum();
  return 0.0;
}

double weight_decay(const torch::optim::OptimizerOptions& options) {
  if (auto* sgd = dynamic_cast<const torch::optim::SGDOptions*>(&options)) return sgd->weight_decay();
  if (auto* adam = dynamic_cast<const torch::optim::AdamOptions*>(&options)) return adam->weight_decay();
  if (auto* adamw = dynamic_cast<const torch::optim::AdamWOptions*>(&options)) return adamw->weight_decay();
  if (auto* rms = dynamic_cast<const torch::optim::RMSpropOptions*>(&options)) return rms->weight_decay();
  if (auto* adagrad = dynamic_cast<const torch::optim::AdagradOptions*>(&options)) return adagrad->weight_decay();
  return 0.0;
}

}  // namespace

LearningRateMonitor::LearningRateMonitor(LearningRateMonitorOptions options) : options_(std::move(options)) {
  const auto& interval = options_.logging_interval();
  if (!interval.empty() && interval != "step" && interval != "epoch") {
    throw UsageError("LearningRateMonitor(logging_interval='" + interval +
                     "') is invalid: use \"step\", \"epoch\" or \"\" (the schedulers' interval).");
  }
}

void LearningRateMonitor::on_fit_start(TrainerView& trainer, TrainingModule& module) {
  per_step_ = options_.logging_interval() == "step";
  if (options_.logging_interval().empty()) {
    for (const auto& config : trainer.lr_schedulers()) per_step_ = per_step_ || config.interval == "step";
  }
  names_.clear();
  std::map<std::string, int> seen;
  for (const auto& optimizer : trainer.optimizers()) {
    const std::string type = class_name(*optimizer);
    const int count = seen[type]++;
    const std::string base = "lr-" + type + (count > 0 ? "-" + std::to_string(count) : "");
    const size_t groups = optimizer->param_groups().size();
    for (size_t g = 0; g < groups; ++g) names_.push_back(groups > 1 ? base + "/pg" + std::to_string(g + 1) : base);
  }
}

std::map<std::string, double> LearningRateMonitor::current_values(TrainerView& trainer) const {
  std::map<std::string, double> values;
  size_t next = 0;
  for (const auto& optimizer : trainer.optimizers()) {
    for (const auto& group : optimizer->param_groups()) {
      if (next == names_.size()) return values;  // optimizers changed after fit started
      const std::string& name = names_[next++];
      values[name] = group.options().get_lr();
      if (options_.log_momentum()) values[name + "-momentum"] = momentum(group.options());
      if (options_.log_weight_decay()) values[name + "-weight_decay"] = weight_decay(group.options());
    }
  }
  return values;
}

void LearningRateMonitor::record(TrainerView& trainer, int64_t step) {
  const auto values = current_values(trainer);
  for (const auto& [name, value] : values) history_[name].push_back(value);
  if (values.empty() || !trainer.is_global_zero()) return;
  trainer.log_metrics(values, step);
}

void LearningRateMonitor::on_train_epoch_start(TrainerView& trainer, TrainingModule& module) {
  if (!per_step_) record(trainer, trainer.global_step());
}

void LearningRateMonitor::on_before_optimizer_step(TrainerView& trainer, TrainingModule& module) {
  // The step about to run is number global_step + 1, the step its loss is logged at.
  const int64_t step = trainer.global_step() + 1;
  if (per_step_ && step % trainer.log_every_n_steps() == 0) record(trainer, step);
}

void LearningRateMonitor::on_train_batch_end(TrainerView& trainer, TrainingModule& module, const torch::Tensor& loss,
                                             int64_t batch_idx) {
  // Manual optimisation has no optimizer-step hook; its steps are counted per batch.
  if (!per_step_ || module.automatic_optimization()) return;
  if (trainer.global_step() % trainer.log_every_n_steps() == 0) record(trainer, trainer.global_step());
}

}  // namespace lockstep
