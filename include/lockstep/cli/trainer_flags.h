#pragma once
/// The Trainer flags that every Lockstep binary accepts. Each flag can also be set through the
/// environment as LOCKSTEP_TRAINER_<FLAG> (e.g. LOCKSTEP_TRAINER_DEVICES=2, like Lightning's
/// PL_TRAINER_GPUS); a flag on the command line wins over the environment.

#include <string>

#include <CLI/CLI.hpp>

namespace lockstep {
namespace cli {

/// The runtime part of the Trainer flags (the Trainer issue adds the loop flags).
struct TrainerFlags {
  std::string accelerator = "auto";          ///< auto|cpu|cuda|gpu
  std::string devices = "auto";              ///< auto, N, -1, "0,2", "[0, 1]"
  std::string strategy = "auto";             ///< auto|single_device|ddp|ddp_fork|...
  int num_nodes = 1;                         ///< nodes in the job
  std::string process_group_backend = "";    ///< gloo|nccl|mpi; "" = gloo on cpu, nccl on cuda
  double timeout = 1800;                     ///< seconds any collective may block
};

/// Adds the flags to `app`, each with its LOCKSTEP_TRAINER_<FLAG> variable.
void add_trainer_flags(CLI::App& app, TrainerFlags& flags);

/// Runs `app.parse`, printing help (exit 0) or a parse error with a hint (exit 2). Returns -1
/// when parsing succeeded and the program should go on, else the exit code to return.
int parse_or_exit_code(CLI::App& app, int argc, char** argv);

}  // namespace cli
}  // namespace lockstep
