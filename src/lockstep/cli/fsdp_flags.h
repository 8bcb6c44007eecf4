#pragma once
// The --fsdp-* flags. Each is set or not (a value equal to what the strategy has is set); once the
// connector has chosen the strategy (PlanOptions::configure_strategy) the set ones go into its
// ShardingOptions and state dict type, and with a strategy that is no FSDPStrategy they are a
// UsageError naming them.

#include <string>

#include <CLI/CLI.hpp>

#include <lockstep/plan/plan_options.h>

namespace lockstep {
namespace cli {
namespace detail {

/// "--max-epochs" -> "LOCKSTEP_TRAINER_MAX_EPOCHS".
std::string variable_for(const std::string& flag);

/// Adds --fsdp-sharding, --fsdp-auto-wrap-min-params, --fsdp-auto-wrap-types,
/// --fsdp-activation-checkpointing-types, --fsdp-hybrid-shard-size, --fsdp-param-dtype and
/// --fsdp-reduce-dtype to `app`, and with `trainer_checkpoints` --fsdp-state-dict-type (the
/// Trainer's: Fabric::save writes whole tensors), each with its LOCKSTEP_TRAINER_* variable; sets
/// options.configure_strategy to put them on the chosen strategy, after the one it had.
void add_fsdp_flags(CLI::App& app, PlanOptions& options, bool trainer_checkpoints);

}  // namespace detail
}  // namespace cli
}  // namespace lockstep
