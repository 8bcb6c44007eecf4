#pragma once
/// OptimizerConfig: what TrainingModule::configure_optimizers returns.

#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include <torch/optim/optimizer.h>
#include <torch/optim/schedulers/lr_scheduler.h>

#include <lockstep/core/reduce_lr_on_plateau.h>

namespace lockstep {

/// An LR scheduler and when it steps, as Lightning's lr_scheduler_config dict:
///   {std::make_shared<torch::optim::StepLR>(*sgd, 10), "epoch"}
///   {std::make_shared<lockstep::ReduceLROnPlateau>(*sgd), "epoch", "val_loss"}
struct SchedulerConfig {
  std::shared_ptr<torch::optim::LRScheduler> scheduler;
  /// "epoch" (after each training epoch and its validation) or "step" (after each optimizer step
  /// and its batch's hooks).
  std::string interval = "epoch";
  /// The logged metric a ReduceLROnPlateau steps with (required for one, refused for others).
  std::string monitor;
  /// A monitored metric missing when the scheduler steps is an error naming those logged; false:
  /// rank 0 warns once and the step is skipped.
  bool strict = true;
};

/// What configure_optimizers returns: one or more optimizers, and optional schedulers.
struct OptimizerConfig {
  OptimizerConfig() = default;
  /// One optimizer, as in `return std::make_shared<torch::optim::Adam>(parameters(), 1e-3);`
  template <typename Opt, typename = std::enable_if_t<std::is_base_of<torch::optim::Optimizer, Opt>::value>>
  OptimizerConfig(std::shared_ptr<Opt> optimizer) : optimizers{std::move(optimizer)} {}  // NOLINT
  std::vector<std::shared_ptr<torch::optim::Optimizer>> optimizers;
  std::vector<SchedulerConfig> schedulers;
};

}  // namespace lockstep
