#pragma once
/// The environment variables of one worker process, exactly as torchrun sets them.

#include <map>
#include <string>

#include <lockstep/core/libtorch_compat.h>
#include <lockstep/launchers/launch_options.h>

namespace lockstep {
namespace launchers {

/// The variable that turns on NCCL's asynchronous error handling, under the name this build's
/// LibTorch reads and its torchrun sets (NCCL_ASYNC_ERROR_HANDLING up to torch 2.1,
/// TORCH_NCCL_ASYNC_ERROR_HANDLING from 2.2).
constexpr const char* kNcclAsyncErrorHandling = libtorch::kNcclAsyncErrorHandling;

/// The variables torch 1.13's torchrun (elastic agent, static rendezvous) adds to a worker's
/// environment, so a program cannot tell our launch from torchrun's:
///   RANK                = node_rank * nproc_per_node + local_rank; ROLE_RANK the same
///   LOCAL_RANK          = local_rank
///   WORLD_SIZE          = nnodes * nproc_per_node; ROLE_WORLD_SIZE the same
///   LOCAL_WORLD_SIZE    = nproc_per_node
///   GROUP_RANK          = node_rank;  GROUP_WORLD_SIZE = nnodes
///   ROLE_NAME           = "default"
///   MASTER_ADDR, MASTER_PORT = master_addr, resolved_port
///   TORCHELASTIC_RESTART_COUNT = restart_count (0 for the first attempt)
///   TORCHELASTIC_MAX_RESTARTS = max_restarts
///   TORCHELASTIC_RUN_ID = run_id
///   TORCHELASTIC_USE_AGENT_STORE = "False" (rank 0 hosts the store; no agent does)
///   TORCHELASTIC_ERROR_FILE = <log_dir>/attempt_<restart_count>/<local_rank>/error.json, where an empty
///                         log_dir stands for $TMPDIR/lockstep_<run_id> (launchers replace an empty
///                         log_dir by a fresh private folder before calling this)
///   kNcclAsyncErrorHandling = the parent's value, else "1"
///   OMP_NUM_THREADS     = the parent's value; "1" if unset and nproc_per_node > 1; else absent
/// Throws LaunchError when local_rank is outside 0..nproc_per_node-1, resolved_port outside
/// 1..65535 or restart_count outside 0..max_restarts.
std::map<std::string, std::string> worker_variables(const LaunchOptions& options, int local_rank,
                                                    int resolved_port, int restart_count = 0);

/// A TCP port that is free on this node now (bound to port 0 and released). Another process may
/// take it before rank 0 binds it; the window is short. Throws LaunchError when no socket opens.
int find_free_port();

/// `options.master_port()`, or `find_free_port()` when it is 0.
int resolve_master_port(const LaunchOptions& options);

}  // namespace launchers
}  // namespace lockstep
