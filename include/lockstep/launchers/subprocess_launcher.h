#pragma once
/// SubprocessLauncher: local rank 0 re-executes its own program for local ranks 1..N-1.

#include <chrono>
#include <string>

#include "lockstep/launchers/launch_options.h"
#include "lockstep/launchers/launcher.h"

namespace lockstep {
namespace launchers {

/// The launcher of `--strategy ddp`: the calling process becomes local rank 0 and starts
/// /proc/self/exe with its own argv (from /proc/self/cmdline) as local ranks 1..N-1, each with
/// `worker_variables()` added to its environment; rank 0 sets its own variables with setenv, so
/// environment detection afterwards sees a torchelastic job in every worker.
/// - A background thread supervises the children: when one exits non-zero, the others are
///   terminated and this whole process ends with that code (std::_Exit, stderr flushed).
/// - At exit, rank 0 waits up to `options.exit_timeout()` for the children, then terminates
///   those still running; a failed child's code becomes the process's.
/// - The children die with the thread that called `launch()` (PR_SET_PDEATHSIG): call it from
///   the main thread.
/// - In a process that already is a worker (RANK, GROUP_RANK, LOCAL_RANK, LOCAL_WORLD_SIZE all
///   set, e.g. a child, or under torchrun) `launch()` starts nothing.
/// ```
///   SubprocessLauncher launcher(LaunchOptions().nproc_per_node(4));
///   launcher.launch();  // returns in all 4 processes; std::getenv("RANK") tells them apart
/// ```
class SubprocessLauncher : public Launcher {
 public:
  explicit SubprocessLauncher(LaunchOptions options = LaunchOptions());

  std::string name() const override { return "subprocess"; }
  /// Throws LaunchError (nothing started) for invalid options, an unreadable /proc/self/cmdline,
  /// or a second launch of this process.
  void launch() override;
  /// What runs at exit: waits up to `timeout` for the other local workers, terminates those still
  /// running, and returns the job's code (0; the first failed worker's code; 1 when workers had to
  /// be terminated). Runs once per process; later calls, and calls in a worker, return at once.
  int wait_for_workers(std::chrono::milliseconds timeout);

  const LaunchOptions& options() const { return options_; }

 private:
  LaunchOptions options_;
};

}  // namespace launchers
}  // namespace lockstep
