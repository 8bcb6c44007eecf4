#include <lockstep/launchers/local_launcher.h>

#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <lockstep/launchers/launch_error.h>

#include "local_job.h"
#include "process_utils.h"

namespace lockstep {
namespace launchers {

LocalLauncher::LocalLauncher(LaunchOptions options, StartMethod method)
    : options_(std::move(options)), method_(method) {}

std::string LocalLauncher::name() const { return method_ == StartMethod::fork ? "fork" : "subprocess"; }

void LocalLauncher::check_single_threaded() const {
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
}

std::optional<distributed::Placement> LocalLauncher::launch() {
  if (detail::is_worker_process()) return std::nullopt;
  options_.validate();
  if (method_ == StartMethod::fork) check_single_threaded();
  const bool reexec = method_ == StartMethod::reexec;
  const auto argv = reexec ? detail::self_command_line() : std::vector<std::string>{};
  const auto environment = reexec ? detail::current_environment() : std::map<std::string, std::string>{};
  detail::LocalJob& job = detail::LocalJob::begin(options_);
  // Started from this thread, not the watcher: re-executed workers' PR_SET_PDEATHSIG fires when
  // the thread that started them ends.
  try {
    for (int rank = 1; rank < job.options().nproc_per_node(); ++rank) {
      if (reexec) {
        job.supervisor().spawn(rank, "/proc/self/exe", argv, detail::merged(environment, job.variables(rank)));
      } else if (job.supervisor().fork_worker(rank) == 0) {
        job.export_variables(rank);
        return job.placement(rank);
      }
    }
  } catch (...) {
    job.supervisor().terminate_all();
    throw;
  }
  job.export_variables(0);
  job.watch();
  return job.placement(0);
}

int LocalLauncher::wait_for_workers(std::chrono::milliseconds timeout) {
  detail::LocalJob* job = detail::LocalJob::current();
  return job != nullptr ? job->finish(timeout) : 0;
}

}  // namespace launchers
}  // namespace lockstep
