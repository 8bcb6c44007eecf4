#include "lockstep/launchers/subprocess_launcher.h"

#include "local_job.h"
#include "process_utils.h"

namespace lockstep {
namespace launchers {

SubprocessLauncher::SubprocessLauncher(LaunchOptions options) : options_(std::move(options)) {}

void SubprocessLauncher::launch() {
  if (detail::is_worker_process()) return;
  options_.validate();
  const auto argv = detail::self_command_line();
  const auto environment = detail::current_environment();
  detail::LocalJob& job = detail::LocalJob::begin(options_);
  // Started from this thread, not the watcher: the children's PR_SET_PDEATHSIG fires when the
  // thread that forked them ends.
  try {
    for (int rank = 1; rank < job.options().nproc_per_node(); ++rank) {
      job.supervisor().spawn(rank, "/proc/self/exe", argv,
                             detail::merged(environment, job.variables(rank)));
    }
  } catch (...) {
    job.supervisor().terminate_all();
    throw;
  }
  job.export_variables(0);
  job.watch();
}

int SubprocessLauncher::wait_for_workers(std::chrono::milliseconds timeout) {
  detail::LocalJob* job = detail::LocalJob::current();
  return job != nullptr ? job->finish(timeout) : 0;
}

}  // namespace launchers
}  // namespace lockstep
