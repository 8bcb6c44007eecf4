#pragma once
/// Options of LearningRateMonitor (Lightning's LearningRateMonitor arguments).

#include <string>

#include <torch/arg.h>

namespace lockstep {

///   LearningRateMonitor(LearningRateMonitorOptions().logging_interval("step").log_momentum(true))
struct LearningRateMonitorOptions {
  /// "epoch" (at each training epoch's start), "step" (every log_every_n_steps optimizer steps)
  /// or "" (step when a scheduler steps per step, else epoch). Default: "".
  TORCH_ARG(std::string, logging_interval) = "";
  /// Also log momentum (SGD, RMSprop) or beta1 (Adam, AdamW) as "lr-<Optimizer>-momentum". Default: false.
  TORCH_ARG(bool, log_momentum) = false;
  /// Also log weight decay as "lr-<Optimizer>-weight_decay". Default: false.
  TORCH_ARG(bool, log_weight_decay) = false;
};

}  // namespace lockstep
