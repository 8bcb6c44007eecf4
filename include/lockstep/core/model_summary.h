#pragma once
/// model_summary: the table Lightning's ModelSummary prints when fit starts.

#include <string>

#include <torch/nn/module.h>

namespace lockstep {

/// The module's direct children (Lightning's max_depth 1) with their type, parameter count and
/// mode, then the totals: trainable, non-trainable and all parameters (a tensor registered
/// twice counted once), their size in MB (their bytes / 1e6), and the modules in train and eval
/// mode. Counts read as Lightning writes them ("101 K", "1.2 M").
///     | Name | Type   | Params | Mode
///   ------------------------------------
///   0 | fc1  | Linear | 6.3 K  | train
///   ...
std::string model_summary(const torch::nn::Module& module);

/// `count` as Lightning's get_human_readable_count: 999 -> "999  ", 1234 -> "1.2 K", 101770 -> "101 K".
std::string human_readable_count(int64_t count);

}  // namespace lockstep
