#pragma once
/// The Launcher interface: turns one process into the N worker processes of this node.

#include <string>

namespace lockstep {
namespace launchers {

/// Starts the other local worker processes. `launch()` returns in every worker (the calling
/// process becomes local rank 0) with the torchrun variables (RANK, LOCAL_RANK, WORLD_SIZE,
/// GROUP_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...) set in its environment, so
/// environment detection afterwards sees a torchelastic-style job. The launcher supervises the
/// workers it started: when one exits non-zero the others are terminated (SIGTERM, then SIGKILL)
/// and the whole job exits with that worker's code; no worker outlives the job.
class Launcher {
 public:
  virtual ~Launcher() = default;
  virtual std::string name() const = 0;
  virtual void launch() = 0;
};

/// For local rank 0 of a job this process launched (subprocess or fork launcher), when it fails
/// itself: terminates the other workers within a second instead of waiting for them at exit,
/// without blaming them, and makes `exit_code` the job's code (unless a worker failed first: then
/// that worker is reported and its code is the job's). Returns the job's code; returns
/// `exit_code` and does nothing in a process that launched no job, or in a worker.
/// `cli::guarded_main` and `Trainer::fit` call it.
int end_launched_job(int exit_code);

}  // namespace launchers
}  // namespace lockstep
