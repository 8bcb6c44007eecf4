#include "lockstep/launchers/fork_launcher.h"

#include <chrono>
#include <string>
#include <thread>

#include "lockstep/launchers/launch_error.h"
#include "local_job.h"
#include "process_utils.h"

namespace lockstep {
namespace launchers {

ForkLauncher::ForkLauncher(LaunchOptions options) : options_(std::move(options)) {}

void ForkLauncher::launch() {
  if (detail::is_worker_process()) return;
  options_.validate();
  detail::stop_idle_blas_threads();
  int threads = detail::count_threads();
  // A joined thread can stay listed for a moment after it exited.
  for (int retry = 0; threads > 1 && retry < 20; ++retry) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    threads = detail::count_threads();
  }
  if (threads > 1) {
    throw LaunchError(
        "ddp_fork must start before any threads exist (found " + std::to_string(threads) +
        " threads: LibTorch's thread pools start at the first tensor operation). Create the "
        "Trainer/launcher before using torch, or use --strategy ddp (re-executes the program "
        "instead of forking).");
  }
  detail::LocalJob& job = detail::LocalJob::begin(options_);
  try {
    for (int rank = 1; rank < job.options().nproc_per_node(); ++rank) {
      if (job.supervisor().fork_worker(rank) == 0) {
        job.export_variables(rank);
        return;
      }
    }
  } catch (...) {
    job.supervisor().terminate_all();
    throw;
  }
  job.export_variables(0);
  job.watch();
}

int ForkLauncher::wait_for_workers(std::chrono::milliseconds timeout) {
  detail::LocalJob* job = detail::LocalJob::current();
  return job != nullptr ? job->finish(timeout) : 0;
}

}  // namespace launchers
}  // namespace lockstep
