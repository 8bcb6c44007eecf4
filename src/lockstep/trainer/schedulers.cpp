// The Trainer's LR schedulers: checked when configure_optimizers returns them, stepped at their
// interval (a ReduceLROnPlateau with its monitored metric), and their state in checkpoints.
#include <iostream>

#include <torch/torch.h>

#include <lockstep/core/reduce_lr_on_plateau.h>
#include <lockstep/trainer/trainer.h>

#include "trainer_internal.h"

namespace lockstep {
namespace {

ReduceLROnPlateau* as_plateau(const SchedulerConfig& config) {
  return dynamic_cast<ReduceLROnPlateau*>(config.scheduler.get());
}

std::string names_of(const std::map<std::string, double>& a, const std::map<std::string, double>& b) {
  std::map<std::string, double> all = a;
  all.insert(b.begin(), b.end());
  std::string names;
  for (const auto& entry : all) names += (names.empty() ? "" : ", ") + entry.first;
  return names.empty() ? "none" : names;
}

}  // namespace

void Trainer::check_schedulers() const {
  for (size_t i = 0; i < optimizer_config_.schedulers.size(); ++i) {
    const auto& c = optimizer_config_.schedulers[i];
    const std::string which = "configure_optimizers: scheduler " + std::to_string(i);
    LOCKSTEP_CHECK(c.scheduler, UsageError, which, " is null; return a scheduler object, or no SchedulerConfig.");
    LOCKSTEP_CHECK(c.interval == "epoch" || c.interval == "step", UsageError, which, " has interval '", c.interval,
                   "'; use \"epoch\" or \"step\".");
    const bool plateau = as_plateau(c) != nullptr;
    LOCKSTEP_CHECK(!plateau || !c.monitor.empty(), UsageError, which, " is a ReduceLROnPlateau without a metric to ",
                   "watch; name one it steps with, as Lightning's \"monitor\": {std::make_shared<lockstep::",
                   "ReduceLROnPlateau>(*optimizer), \"epoch\", \"val_loss\"}.");
    LOCKSTEP_CHECK(plateau || c.monitor.empty(), UsageError, which, " has monitor '", c.monitor, "', but only a ",
                   "lockstep::ReduceLROnPlateau steps with a metric; drop the monitor.");
  }
}

std::optional<double> Trainer::monitored_value(const SchedulerConfig& config, size_t index) {
  const auto& step = metrics_.latest_step_values();
  const auto& first = config.interval == "step" ? step : callback_metrics_;
  const auto& second = config.interval == "step" ? callback_metrics_ : step;
  std::optional<double> value;
  if (first.count(config.monitor)) {
    value = first.at(config.monitor);
  } else if (second.count(config.monitor)) {
    value = second.at(config.monitor);
  }
  // Rank 0's value on every rank: a metric logged without sync_dist differs between ranks, and
  // their learning rates must not.
  if (plan_.strategy->world_size() > 1) {
    const auto shared = plan_.strategy->broadcast(value ? c10::IValue(*value) : c10::IValue(), 0);
    value = shared.isNone() ? std::nullopt : std::optional<double>(shared.toDouble());
  }
  if (value) return value;
  const std::string where = config.interval == "step" ? "at step " + std::to_string(global_step_)
                                                      : "at the end of epoch " + std::to_string(current_epoch_);
  LOCKSTEP_CHECK(!config.strict, UsageError, "ReduceLROnPlateau (scheduler ", index, ") monitors '", config.monitor,
                 "', which was not logged ", where, "; logged: ", names_of(callback_metrics_, step), ". Log it (",
                 "self->log(\"", config.monitor, "\", value)), name a logged metric in SchedulerConfig::monitor, ",
                 "or set SchedulerConfig::strict = false to skip the step while it is missing.");
  if (missing_monitor_warned_.insert(index).second && plan_.strategy->is_global_zero()) {
    std::cerr << "lockstep: warning: ReduceLROnPlateau (scheduler " << index << ") monitors '" << config.monitor
              << "', which was not logged " << where << " (logged: " << names_of(callback_metrics_, step)
              << "); its steps are skipped while it is missing (strict = false). Said once.\n";
  }
  return std::nullopt;
}

void Trainer::step_schedulers(const std::string& interval) {
  if (optimizer_config_.schedulers.empty()) return;
  for (size_t i = 0; i < optimizer_config_.schedulers.size(); ++i) {
    auto& config = optimizer_config_.schedulers[i];
    if (config.interval != interval) continue;
    if (auto* plateau = as_plateau(config)) {
      if (const auto value = monitored_value(config, i)) plateau->step(*value);
    } else {
      config.scheduler->step();
    }
  }
  ++(interval == "step" ? scheduler_step_steps_ : scheduler_epoch_steps_);
}

c10::impl::GenericList Trainer::plateau_states() const {
  c10::impl::GenericList states(c10::AnyType::get());
  for (const auto& config : optimizer_config_.schedulers) {
    const auto* plateau = as_plateau(config);
    states.push_back(plateau ? plateau->state_dict() : c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()));
  }
  return states;
}

void Trainer::restore_schedulers(const c10::impl::GenericDict& saved, const std::string& path) {
  scheduler_epoch_steps_ = saved.at("epoch_steps").toInt();
  scheduler_step_steps_ = saved.at("step_steps").toInt();
  const auto plateaus = saved.contains("plateau") ? saved.at("plateau").toList() : c10::impl::GenericList(c10::AnyType::get());
  for (size_t i = 0; i < optimizer_config_.schedulers.size(); ++i) {
    auto& config = optimizer_config_.schedulers[i];
    if (auto* plateau = as_plateau(config)) {
      LOCKSTEP_CHECK(i < plateaus.size() && plateaus.get(i).toGenericDict().contains("best"), UsageError,
                     "--ckpt-path ", path, " holds no state for scheduler ", i, ", a ReduceLROnPlateau (its best ",
                     "value and bad-step count): it was saved with other schedulers. Resume with the model code ",
                     "that wrote it.");
      plateau->load_state_dict(plateaus.get(i).toGenericDict());
      continue;
    }
    const int64_t n = config.interval == "step" ? scheduler_step_steps_ : scheduler_epoch_steps_;
    for (int64_t k = 0; k < n; ++k) config.scheduler->step();
  }
}

}  // namespace lockstep
