#pragma once
/// OptimizerConfig: what TrainingModule::configure_optimizers returns.

#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include <torch/optim/optimizer.h>
#include <torch/optim/schedulers/lr_scheduler.h>

namespace lockstep {

/// An LR scheduler and when it steps.
struct SchedulerConfig {
  std::shared_ptr<torch::optim::LRScheduler> scheduler;
  /// "epoch" (after each training epoch) or "step" (after each optimizer step).
  std::string interval = "epoch";
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
