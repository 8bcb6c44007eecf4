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

}  // namespace launchers
}  // namespace lockstep
