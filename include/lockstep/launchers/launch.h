#pragma once
/// launch_and_supervise: what `lockstep launch` does, as torchrun does it.

#include <string>
#include <vector>

#include "lockstep/launchers/launch_options.h"

namespace lockstep {
namespace launchers {

/// Starts `options.nproc_per_node()` copies of `command` (PROGRAM ARGS...; PROGRAM is searched in
/// PATH unless it contains a '/') on this node, each with this process's environment plus
/// `worker_variables(options, local_rank, port)`, and supervises them (see Supervisor). Returns 0
/// when all exit 0, else the code of the first worker that failed (128+S when signal S killed it)
/// after terminating the others. SIGINT, SIGTERM and SIGHUP sent to this process are forwarded to
/// the workers, which are then reaped as usual, and the result is 128+signal; a second one kills
/// them at once. master_port 0 picks a free port.
/// Throws LaunchError before starting anything when the options are invalid (validate()) or
/// PROGRAM does not exist or is not executable.
/// ```
///   int code = launch_and_supervise(LaunchOptions().nproc_per_node(2), {"./train", "--seed", "1"});
/// ```
int launch_and_supervise(const LaunchOptions& options, const std::vector<std::string>& command);

}  // namespace launchers
}  // namespace lockstep
