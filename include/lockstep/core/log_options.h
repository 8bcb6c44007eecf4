#pragma once
/// LogOptions: how TrainingModule::log records a value.

#include <optional>

#include <torch/arg.h>

namespace lockstep {

/// How `log` treats a value. Defaults follow Lightning: in training, on_step; in validation and
/// test, on_epoch (mean over the epoch weighted by batch size).
struct LogOptions {
  /// Show it on the progress bar. Default: false.
  TORCH_ARG(bool, prog_bar) = false;
  /// Record every step. Default: unset (true in training, false otherwise).
  TORCH_ARG(std::optional<bool>, on_step) = std::nullopt;
  /// Record the epoch's batch-size-weighted mean. Default: unset (false in training, true otherwise).
  TORCH_ARG(std::optional<bool>, on_epoch) = std::nullopt;
  /// Reduce across ranks (the global weighted mean, one all_reduce). Default: false.
  TORCH_ARG(bool, sync_dist) = false;
  /// Send it to the loggers (CSV, TensorBoard). Default: true.
  TORCH_ARG(bool, logger) = true;
};

}  // namespace lockstep
