#pragma once
/// Options of WeightAveraging, EMAWeightAveraging and StochasticWeightAveraging (Lightning's
/// arguments of the same names), and the averaging functions (torch.optim.swa_utils').

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <torch/arg.h>
#include <torch/types.h>

namespace lockstep {

/// Moves `average` towards `current` in place; `num_averaged`: how many values it holds already
/// (1 or more: the first value is copied, not averaged). torch's avg_fn, in place.
using AveragingFunction =
    std::function<void(torch::Tensor& average, const torch::Tensor& current, int64_t num_averaged)>;

/// The exponential moving average: average = decay * average + (1 - decay) * current, as
/// torch.optim.swa_utils.get_ema_multi_avg_fn(decay) computes it (a lerp).
AveragingFunction get_ema_avg_fn(double decay = 0.999);
/// The equal-weight mean of every value so far (AveragedModel's default, SWA's).
AveragingFunction get_swa_avg_fn();

///   WeightAveraging(WeightAveragingOptions().avg_fn(get_ema_avg_fn(0.99)))
struct WeightAveragingOptions {
  /// How the average takes each new value. Default: null, the equal-weight mean (get_swa_avg_fn).
  TORCH_ARG(AveragingFunction, avg_fn) = nullptr;
  /// Average the buffers too (batch norm's running statistics; integer buffers are copied), as
  /// AveragedModel(use_buffers=True). Default: true (Lightning's WeightAveraging).
  TORCH_ARG(bool, use_buffers) = true;
};

///   EMAWeightAveraging(EMAWeightAveragingOptions().decay(0.999).update_starting_at_step(100))
struct EMAWeightAveragingOptions {
  /// The weight of the old average in each update, in [0, 1]. Default: 0.999.
  TORCH_ARG(double, decay) = 0.999;
  /// Update after optimizer steps whose index (0, 1, ...) is a multiple of this; 0: never after a
  /// step (only at epoch ends, with update_starting_at_epoch). Default: 1.
  TORCH_ARG(int64_t, update_every_n_steps) = 1;
  /// Update after a step only from this step index on. Default: unset (from the first).
  TORCH_ARG(std::optional<int64_t>, update_starting_at_step) = std::nullopt;
  /// Also update at the end of each epoch from this one (0-based) on. Default: unset (never).
  TORCH_ARG(std::optional<int64_t>, update_starting_at_epoch) = std::nullopt;
  /// As WeightAveragingOptions::use_buffers. Default: true.
  TORCH_ARG(bool, use_buffers) = true;
};

///   StochasticWeightAveraging(StochasticWeightAveragingOptions(0.01).swa_epoch_start(0.75))
struct StochasticWeightAveragingOptions {
  /// The learning rate SWA anneals to: one for every parameter group, or one per group of the
  /// optimizer.
  /* implicit */ StochasticWeightAveragingOptions(double swa_lr) : swa_lrs_({swa_lr}) {}
  explicit StochasticWeightAveragingOptions(std::vector<double> swa_lrs) : swa_lrs_(std::move(swa_lrs)) {}

  TORCH_ARG(std::vector<double>, swa_lrs);
  /// Where averaging starts: below 1, a fraction of --max-epochs (epoch int(max_epochs * it),
  /// counted from 1); 1 or more, the epoch itself, counted from 1 (an integer), as Lightning's
  /// int. Default: 0.8.
  TORCH_ARG(double, swa_epoch_start) = 0.8;
  /// Epochs over which the learning rate goes from its value to swa_lrs. Default: 10.
  TORCH_ARG(int64_t, annealing_epochs) = 10;
  /// "cos" or "linear". Default: "cos".
  TORCH_ARG(std::string, annealing_strategy) = "cos";
  /// As WeightAveragingOptions::avg_fn. Default: null, the equal-weight mean.
  TORCH_ARG(AveragingFunction, avg_fn) = nullptr;
};

}  // namespace lockstep
