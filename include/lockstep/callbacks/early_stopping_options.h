#pragma once
/// Options of EarlyStopping (Lightning's EarlyStopping arguments).

#include <optional>
#include <string>

#include <torch/arg.h>

namespace lockstep {

///   EarlyStopping(EarlyStoppingOptions("val_loss").patience(5).min_delta(1e-3))
struct EarlyStoppingOptions {
  /// `monitor`: the logged metric to watch, e.g. "val_loss".
  explicit EarlyStoppingOptions(std::string monitor) : monitor_(std::move(monitor)) {}

  TORCH_ARG(std::string, monitor);
  /// A change smaller than this does not count as an improvement. Default: 0.
  TORCH_ARG(double, min_delta) = 0.0;
  /// Checks without improvement after which training stops. Default: 3.
  TORCH_ARG(int64_t, patience) = 3;
  /// "min" (stop when it stops decreasing) or "max". Default: "min".
  TORCH_ARG(std::string, mode) = "min";
  /// Stop at once when the metric becomes NaN or infinite. Default: true.
  TORCH_ARG(bool, check_finite) = true;
  /// Stop at once when the metric is better than this. Default: unset.
  TORCH_ARG(std::optional<double>, stopping_threshold) = std::nullopt;
  /// Stop at once when the metric is worse than this. Default: unset.
  TORCH_ARG(std::optional<double>, divergence_threshold) = std::nullopt;
  /// Throw UsageError when the metric was never logged (otherwise skip the check). Default: true.
  TORCH_ARG(bool, strict) = true;
  /// Print every check's outcome (rank 0, stderr); the line saying why it stopped is printed
  /// either way. Default: false.
  TORCH_ARG(bool, verbose) = false;
  /// Check after each training epoch (true) or after each validation (false). Default: unset
  /// (true when validation runs every epoch and only at its end, as Lightning).
  TORCH_ARG(std::optional<bool>, check_on_train_epoch_end) = std::nullopt;
};

}  // namespace lockstep
