#pragma once
/// Options of the Tuner's two searches (tuner.h), with Lightning 2.6's defaults
/// (`Tuner.lr_find`, `Tuner.scale_batch_size`).

#include <cstdint>
#include <string>

#include <torch/arg.h>

namespace lockstep {

///   tuner.lr_find(model, train, nullptr, LRFinderOptions().max_lr(0.1).num_training(50));
struct LRFinderOptions {
  /// The learning rate of the first step. Default: 1e-8.
  TORCH_ARG(double, min_lr) = 1e-8;
  /// The learning rate the range ends at (the last step's is one step short of it). Default: 1.0.
  TORCH_ARG(double, max_lr) = 1.0;
  /// Optimizer steps of the range test; the loader's epochs repeat when it has fewer. Default: 100.
  TORCH_ARG(int64_t, num_training) = 100;
  /// "exponential" (lr grows by a constant factor per step) or "linear". Default: "exponential".
  TORCH_ARG(std::string, mode) = "exponential";
  /// Stop when the smoothed loss exceeds this many times the best so far; 0 never stops early
  /// (Lightning's None). Default: 4.0.
  TORCH_ARG(double, early_stop_threshold) = 4.0;
  /// Weight of the running average that smooths the loss. Default: 0.98.
  TORCH_ARG(double, beta) = 0.98;
  /// Set the suggested learning rate on the optimizer's parameter groups afterwards (Lightning's
  /// update_attr). Default: true.
  TORCH_ARG(bool, update_lr) = true;
  /// Where rank 0 writes the results (step, lr, loss, suggested), for `lockstep plot`; "" writes
  /// nothing. Default: "" (the Trainer's --lr-find writes <log_dir>/lr_find.csv).
  TORCH_ARG(std::string, csv_path) = "";
};

///   tuner.scale_batch_size(model, train, nullptr, BatchSizeFinderOptions().mode("binsearch"));
struct BatchSizeFinderOptions {
  /// "power" (double until a trial fails) or "binsearch" (double, then bisect to the largest
  /// size that runs). Default: "power".
  TORCH_ARG(std::string, mode) = "power";
  /// Optimizer steps per trial. Default: 3.
  TORCH_ARG(int64_t, steps_per_trial) = 3;
  /// The batch size of the first trial. Default: 2.
  TORCH_ARG(int64_t, init_val) = 2;
  /// Trials at most. Default: 25.
  TORCH_ARG(int64_t, max_trials) = 25;
  /// "binsearch" only: the size found is lowered by this fraction, room for the memory a longer
  /// run may need (Lightning 2.6's margin); 0 keeps the boundary. Default: 0.05.
  TORCH_ARG(double, margin) = 0.05;
  /// No trial is larger than this. Default: 8192.
  TORCH_ARG(int64_t, max_val) = 8192;
};

}  // namespace lockstep
