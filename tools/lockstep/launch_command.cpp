// `lockstep launch --nproc-per-node N [...] -- PROGRAM ARGS`: torchrun's job, supervised.
#include <lockstep/launchers/launch.h>

#include "commands.h"

namespace lockstep {
namespace tool {
namespace {

struct LaunchArgs {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  double grace_seconds = 5;
  int max_restarts = 0;
  std::vector<std::string> command;
};

}  // namespace

Command add_launch_command(CLI::App& app) {
  auto args = std::make_shared<LaunchArgs>();
  auto* sub = app.add_subcommand("launch",
                                 "Start and supervise workers with the variables torchrun sets: "
                                 "lockstep launch --nproc-per-node 2 -- PROGRAM ARGS");
  sub->add_option("--nproc-per-node", args->nproc_per_node, "workers on this node")
      ->check(CLI::Range(1, 1024))->capture_default_str();
  sub->add_option("--nnodes", args->nnodes, "nodes in the job")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  sub->add_option("--node-rank", args->node_rank, "this node's rank")->check(CLI::Range(0, 1 << 20))->capture_default_str();
  sub->add_option("--master-addr", args->master_addr, "address of the node with rank 0")->capture_default_str();
  sub->add_option("--master-port", args->master_port, "port on that node; 0 picks a free one (one node only)")
      ->check(CLI::Range(0, 65535))->capture_default_str();
  sub->add_option("--grace-period", args->grace_seconds,
                  "seconds before SIGKILL when a worker fails, or after a forwarded Ctrl-C/SIGTERM (a "
                  "Trainer stops and saves last.ckpt meanwhile)")
      ->check(CLI::Range(0.001, 3600.0))->capture_default_str();
  sub->add_option("--max-restarts", args->max_restarts,
                  "times to start all workers again after one fails, with a new rendezvous (one node only)")
      ->check(CLI::Range(0, 1 << 20))->capture_default_str();
  sub->add_option("command", args->command, "the program and its arguments, after --")->required();
  return {sub, [args] {
    const auto options = launchers::LaunchOptions()
                             .nproc_per_node(args->nproc_per_node)
                             .nnodes(args->nnodes)
                             .node_rank(args->node_rank)
                             .master_addr(args->master_addr)
                             .master_port(args->master_port)
                             .grace_period(std::chrono::milliseconds(static_cast<int64_t>(args->grace_seconds * 1000)))
                             .max_restarts(args->max_restarts);
    return launchers::launch_and_supervise(options, args->command);
  }};
}

}  // namespace tool
}  // namespace lockstep
