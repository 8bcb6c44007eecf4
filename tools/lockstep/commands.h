#pragma once
// The subcommands of the `lockstep` tool. Each registers its flags on a CLI11 subcommand and
// returns the function that runs it (returning the process exit code).

#include <functional>

#include <CLI/CLI.hpp>

namespace lockstep {
namespace tool {

/// A subcommand and what runs it when it was given.
struct Command {
  CLI::App* app;
  std::function<int()> run;
};

Command add_env_command(CLI::App& app);
Command add_launch_command(CLI::App& app);
Command add_comm_bench_command(CLI::App& app);
Command add_plot_command(CLI::App& app);
Command add_ckpt_command(CLI::App& app);

}  // namespace tool
}  // namespace lockstep
