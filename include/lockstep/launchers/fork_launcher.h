#pragma once
/// ForkLauncher: local rank 0 forks local ranks 1..N-1 (`--strategy ddp_fork`).

#include <chrono>
#include <string>

#include "lockstep/launchers/launch_options.h"
#include "lockstep/launchers/launcher.h"

namespace lockstep {
namespace launchers {

/// The launcher of `--strategy ddp_fork`: like SubprocessLauncher, but the workers are forks of
/// the calling process, so `launch()` returns in each of them with its variables set (setenv),
/// without re-running the program from main(). A fork copies one thread only, so `launch()`
/// refuses (LaunchError) once the process has more than one thread; LibTorch starts its thread
/// pools at the first tensor operation, so launch before touching torch. (OpenBLAS's idle pool,
/// started when the library loads, is stopped first and not counted: OpenBLAS stops it before
/// every fork itself and restarts it at the next BLAS call.) The forked workers run
/// no supervisor thread and no exit-time wait; rank 0 runs both, as SubprocessLauncher's does.
/// ```
///   int main() {
///     ForkLauncher(LaunchOptions().nproc_per_node(2)).launch();  // before any tensor
///     auto x = torch::ones({2});                                  // in both workers
///   }
/// ```
class ForkLauncher : public Launcher {
 public:
  explicit ForkLauncher(LaunchOptions options = LaunchOptions());

  std::string name() const override { return "fork"; }
  /// Throws LaunchError (nothing started) for invalid options, more than one thread, or a
  /// second launch of this process.
  void launch() override;
  /// See SubprocessLauncher::wait_for_workers.
  int wait_for_workers(std::chrono::milliseconds timeout);

  const LaunchOptions& options() const { return options_; }

 private:
  LaunchOptions options_;
};

}  // namespace launchers
}  // namespace lockstep
