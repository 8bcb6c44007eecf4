#pragma once
/// The Trainer flags that every Lockstep binary accepts. Each flag can also be set through the
/// environment as LOCKSTEP_TRAINER_<FLAG> (e.g. LOCKSTEP_TRAINER_DEVICES=2). Which value wins, as
/// in Lightning 2.x, where PL_TRAINER_* are defaults (the connector of Lightning 1.x let
/// PL_TRAINER_GPUS override the Trainer's gpus argument instead):
///   - A program with these flags: a flag on the command line > its variable > the value the
///     program set in the options before add_*_flags (the flag's default in --help) > the
///     library's default. A value the program sets after parsing replaces any of them.
///   - Options built in code, without these flags: a value set in code > the variable > the
///     library's default. The Trainer and Fabric apply the variables when they are made, to the
///     fields still at their defaults (apply_trainer_variables); add_plan_flags turns that off
///     (PlanOptions::trainer_variables), so the variables are read once.
/// A variable with a bad value stops the program as the flag would (exit code 2); one that names
/// no flag is a warning.
/// add_trainer_flags, add_fabric_flags and add_plan_flags also add --config FILE.yaml (the flags
/// from a file: `trainer:` for these, `model:` for the program's own; the command line wins over
/// the file, the file over the variables) and --print-config (the resolved flags as YAML, exit 0),
/// which parse_or_exit_code handles; it also hands that YAML to the Trainer (program_config.h).

#include <CLI/CLI.hpp>

#include <lockstep/fabric/fabric_options.h>
#include <lockstep/plan/plan_options.h>
#include <lockstep/trainer/trainer_options.h>

namespace lockstep {
namespace cli {

/// Adds the PlanOptions fields (--accelerator, --devices, --strategy, --num-nodes, --precision,
/// ...) to `app`, each with its LOCKSTEP_TRAINER_<FLAG> variable: the flags the Trainer and Fabric
/// share, registered here once. Sets options.trainer_variables(false): the parse reads them.
/// Adds the FSDP flags too (--fsdp-sharding, --fsdp-auto-wrap-min-params, --fsdp-auto-wrap-types,
/// --fsdp-activation-checkpointing-types, --fsdp-hybrid-shard-size, --fsdp-param-dtype,
/// --fsdp-reduce-dtype): each one given (a value equal to the strategy's own counts) is set on the
/// FSDPStrategy the connector chooses, through options.configure_strategy; with any other strategy
/// they are a UsageError naming them (exit code 2).
void add_plan_flags(CLI::App& app, PlanOptions& options);

/// Adds every TrainerOptions field to `app` as a flag with its LOCKSTEP_TRAINER_<FLAG> variable,
/// the plan's flags (add_plan_flags) and --fsdp-state-dict-type (full|sharded checkpoints).
/// Counts and fractions (--limit-train-batches) are parsed as they are read: a bad value is exit
/// code 2 from parse_or_exit_code, before any process starts.
void add_trainer_flags(CLI::App& app, TrainerOptions& options);

/// Adds the FabricOptions fields (the plan's flags, add_plan_flags) to `app`, and --seed, which
/// seeds every generator when it is read (as the Trainer's does) and sets `seed`.
void add_fabric_flags(CLI::App& app, FabricOptions& options, int64_t& seed);

/// Runs `app.parse`, printing help (exit 0) or a parse error with a hint (exit 2). Returns -1
/// when parsing succeeded and the program should go on, else the exit code to return.
int parse_or_exit_code(CLI::App& app, int argc, char** argv);

}  // namespace cli
}  // namespace lockstep
