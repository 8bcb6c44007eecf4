#pragma once
/// launch_and_supervise: what `lockstep launch` does, as torchrun does it.

#include <string>
#include <vector>

#include <lockstep/launchers/launch_options.h>

namespace lockstep {
namespace launchers {

/// Starts `options.nproc_per_node()` copies of `command` (PROGRAM ARGS...; PROGRAM is searched in
/// PATH unless it contains a '/') on this node, each with this process's environment plus
/// `worker_variables(options, local_rank, port, restart)`, and supervises them (see Supervisor).
/// When a worker fails, the others are terminated; then, while fewer than
/// `options.max_restarts()` restarts happened, all workers start again as restart 1, 2, ...
/// (TORCHELASTIC_RESTART_COUNT), each attempt with a new rendezvous: a new rendezvous file and,
/// when master_port is 0, a new free port. Returns 0 when all workers of an attempt exit 0, else
/// the code of the first worker that failed in the last attempt (128+S when signal S killed it).
/// SIGINT, SIGTERM and SIGHUP sent to this process are forwarded to the workers, which get the
/// grace period to end (a Trainer saves last.ckpt meanwhile) before SIGKILL, and the result is
/// 128+signal with no restart; a second one (even one that came before the first was forwarded)
/// kills them at once.
/// Throws LaunchError before starting anything when the options are invalid (validate()) or
/// PROGRAM does not exist or is not executable.
/// ```
///   int code = launch_and_supervise(LaunchOptions().nproc_per_node(2).max_restarts(3),
///                                   {"./train", "--seed", "1"});
/// ```
int launch_and_supervise(const LaunchOptions& options, const std::vector<std::string>& command);

}  // namespace launchers
}  // namespace lockstep
