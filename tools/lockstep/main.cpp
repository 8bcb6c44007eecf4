// lockstep: inspect the environment, launch and supervise workers, benchmark collectives, plot runs,
// inspect and convert checkpoints.
#include <lockstep/cli/guarded_main.h>
#include <lockstep/cli/trainer_flags.h>

#include "commands.h"

int main(int argc, char** argv) {
  CLI::App app{"Lockstep: distributed training for LibTorch. Inspect, launch, benchmark, plot, convert checkpoints.", "lockstep"};
  app.require_subcommand(1);
  const lockstep::tool::Command commands[] = {lockstep::tool::add_env_command(app),
                                               lockstep::tool::add_launch_command(app),
                                               lockstep::tool::add_comm_bench_command(app),
                                               lockstep::tool::add_plot_command(app),
                                               lockstep::tool::add_ckpt_command(app)};
  const int parsed = lockstep::cli::parse_or_exit_code(app, argc, argv);
  if (parsed >= 0) return parsed;
  return lockstep::cli::guarded_main("lockstep", [&] {
    for (const auto& command : commands) {
      if (command.app->parsed()) return command.run();
    }
    return 2;
  });
}
