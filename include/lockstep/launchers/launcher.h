#pragma once
/// The Launcher interface: turns one process into the N worker processes of this node.

#include <optional>
#include <string>

#include <lockstep/distributed/placement.h>

namespace lockstep {
namespace launchers {

/// Starts the other local worker processes. `launch()` returns in every worker that continues from
/// the call (the calling process becomes local rank 0) with that worker's placement; a worker
/// that starts from main() (a re-executed one) finds the torchrun variables (RANK, LOCAL_RANK,
/// WORLD_SIZE, GROUP_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...) in its environment,
/// where environment detection sees a torchelastic-style job, and its `launch()` returns nullopt.
/// The launcher supervises the workers it started: when one exits non-zero the others are
/// terminated (SIGTERM, then SIGKILL) and the whole job exits with that worker's code; no worker
/// outlives the job.
class Launcher {
 public:
  virtual ~Launcher() = default;
  virtual std::string name() const = 0;
  virtual std::optional<distributed::Placement> launch() = 0;
};

/// For local rank 0 of a job this process launched (subprocess or fork launcher), when it fails
/// itself: terminates the other workers within a second instead of waiting for them at exit,
/// without blaming them, and makes `exit_code` the job's code (unless a worker failed first: then
/// that worker is reported and its code is the job's). Returns the job's code; returns
/// `exit_code` and does nothing in a process that launched no job, or in a worker.
/// `cli::guarded_main` and `Trainer::fit` call it.
int end_launched_job(int exit_code);

/// For local rank 0 of a job this process launched: every rank agreed to end with `exit_code`
/// (128 + a signal, after a stop by signal), so a worker that exits with it is not a failure
/// that ends this process before it reports the stop. Does nothing elsewhere. `Trainer::fit`
/// calls it.
void expect_launched_job_exit(int exit_code);

}  // namespace launchers
}  // namespace lockstep
