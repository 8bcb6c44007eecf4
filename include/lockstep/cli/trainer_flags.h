#pragma once
/// The Trainer flags that every Lockstep binary accepts. Each flag can also be set through the
/// environment as LOCKSTEP_TRAINER_<FLAG> (e.g. LOCKSTEP_TRAINER_DEVICES=2, like Lightning's
/// PL_TRAINER_GPUS); a flag on the command line wins over the environment.

#include <CLI/CLI.hpp>

#include <lockstep/fabric/fabric_options.h>
#include <lockstep/trainer/trainer_options.h>

namespace lockstep {
namespace cli {

/// Adds every TrainerOptions field to `app` as a flag with its LOCKSTEP_TRAINER_<FLAG> variable.
void add_trainer_flags(CLI::App& app, TrainerOptions& options);

/// Adds the FabricOptions fields to `app` with the Trainer's flag names and variables, and
/// --seed, which seeds every generator when it is read (as the Trainer's does) and sets `seed`.
void add_fabric_flags(CLI::App& app, FabricOptions& options, int64_t& seed);

/// Runs `app.parse`, printing help (exit 0) or a parse error with a hint (exit 2). Returns -1
/// when parsing succeeded and the program should go on, else the exit code to return.
int parse_or_exit_code(CLI::App& app, int argc, char** argv);

}  // namespace cli
}  // namespace lockstep
