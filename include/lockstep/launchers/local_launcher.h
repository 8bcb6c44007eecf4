#pragma once
/// LocalLauncher: the calling process becomes local rank 0 and starts local ranks 1..N-1, by
/// re-executing its own program or by forking (Lightning's start_method).

#include <chrono>
#include <optional>
#include <string>

#include <lockstep/distributed/placement.h>
#include <lockstep/launchers/launch_options.h>
#include <lockstep/launchers/launcher.h>

namespace lockstep {
namespace launchers {

/// How the other local workers start.
enum class StartMethod {
  /// `--strategy ddp`: /proc/self/exe with this process's argv (from /proc/self/cmdline), with
  /// `worker_variables()` added to its environment; the workers run main() from the start.
  reexec,
  /// `--strategy ddp_fork`: forks of the calling process, so `launch()` returns in each of them
  /// without re-running main(). A fork copies one thread only, so `launch()` refuses
  /// (LaunchError) once the process has more than one thread; LibTorch starts its thread pools at
  /// the first tensor operation, so launch before touching torch. (OpenBLAS's idle pool, started
  /// when the library loads, is stopped first and not counted: OpenBLAS stops it before every
  /// fork itself and restarts it at the next BLAS call.)
  fork,
};

/// - `launch()` returns in rank 0 and in every forked worker with that process's placement; its
///   variables are also exported (setenv), as torchrun's and Lightning's launchers do, for code
///   that reads RANK or LOCAL_RANK.
/// - A background thread in rank 0 supervises the others: when one exits non-zero, the rest are
///   terminated and this whole process ends with that code (std::_Exit, stderr flushed).
/// - At exit, rank 0 waits up to `options.exit_timeout()` for the others, then terminates those
///   still running; a failed worker's code becomes the process's.
/// - Re-executed workers die with the thread that called `launch()` (PR_SET_PDEATHSIG): call it
///   from the main thread.
/// - In a process that already is a worker (RANK, GROUP_RANK, LOCAL_RANK, LOCAL_WORLD_SIZE all
///   set, e.g. a re-executed worker, or under torchrun) `launch()` starts nothing and returns
///   nullopt: the environment describes the process.
/// ```
///   LocalLauncher launcher(LaunchOptions().nproc_per_node(4), StartMethod::reexec);
///   auto placement = launcher.launch();  // in rank 0; ranks 1..3 run main() again
/// ```
class LocalLauncher : public Launcher {
 public:
  explicit LocalLauncher(LaunchOptions options = LaunchOptions(), StartMethod method = StartMethod::reexec);

  /// "subprocess" or "fork".
  std::string name() const override;
  /// With max_restarts > 0, a failure (a worker's, or this process's through end_launched_job)
  /// ends the workers and starts this program again in place of this process, with the command
  /// line and environment it started with, up to max_restarts times; the program resumes itself
  /// (the Trainer's --ckpt-path last). A stop (exit code 128 + SIGINT, SIGTERM, SIGUSR1) is not
  /// restarted. Throws LaunchError (nothing started) for invalid options, an unreadable
  /// /proc/self/cmdline, a fork with more than one thread, or a second launch of this process.
  std::optional<distributed::Placement> launch() override;
  /// What runs at exit: waits up to `timeout` for the other local workers, terminates those still
  /// running, and returns the job's code (0; the first failed worker's code; 1 when workers had to
  /// be terminated). Runs once per process; later calls, and calls in a worker, return at once.
  static int wait_for_workers(std::chrono::milliseconds timeout);

  const LaunchOptions& options() const { return options_; }
  StartMethod start_method() const { return method_; }

 private:
  void check_single_threaded() const;

  LaunchOptions options_;
  StartMethod method_;
};

}  // namespace launchers
}  // namespace lockstep
