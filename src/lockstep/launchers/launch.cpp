#include "lockstep/launchers/launch.h"

#include <signal.h>

#include <array>
#include <atomic>

#include "lockstep/launchers/launch_error.h"
#include "lockstep/launchers/supervisor.h"
#include "lockstep/launchers/worker_environment.h"
#include "process_utils.h"

namespace lockstep {
namespace launchers {

namespace {

std::atomic<Supervisor*> active_supervisor{nullptr};

void forward_to_workers(int signal) {
  if (Supervisor* supervisor = active_supervisor.load()) supervisor->interrupt(signal);
}

// While alive: SIGINT, SIGTERM and SIGHUP go to the supervisor's workers instead of ending this
// process, and SIGCHLD is not ignored (the kernel would reap the workers and lose their codes).
class ForwardSignals {
 public:
  explicit ForwardSignals(Supervisor& supervisor) {
    Supervisor* expected = nullptr;
    if (!active_supervisor.compare_exchange_strong(expected, &supervisor)) {
      throw LaunchError("launch_and_supervise is already running in this process; "
                        "run one launch at a time.");
    }
    struct sigaction forward {};
    forward.sa_handler = forward_to_workers;
    sigemptyset(&forward.sa_mask);
    forward.sa_flags = SA_RESTART;
    for (std::size_t i = 0; i < kForwarded.size(); ++i) {
      ::sigaction(kForwarded[i], &forward, &previous_[i]);
    }
    struct sigaction child {};
    child.sa_handler = SIG_DFL;
    sigemptyset(&child.sa_mask);
    ::sigaction(SIGCHLD, &child, &previous_child_);
  }
  ~ForwardSignals() {
    for (std::size_t i = 0; i < kForwarded.size(); ++i) {
      ::sigaction(kForwarded[i], &previous_[i], nullptr);
    }
    ::sigaction(SIGCHLD, &previous_child_, nullptr);
    active_supervisor.store(nullptr);
  }
  ForwardSignals(const ForwardSignals&) = delete;
  ForwardSignals& operator=(const ForwardSignals&) = delete;

 private:
  static constexpr std::array<int, 3> kForwarded = {SIGINT, SIGTERM, SIGHUP};
  std::array<struct sigaction, 3> previous_{};
  struct sigaction previous_child_ {};
};

// The private rendezvous folder goes when the launch returns or throws.
struct RemovedAtReturn {
  const std::string& store_file;
  ~RemovedAtReturn() { detail::remove_private_store(store_file); }
};

}  // namespace

int launch_and_supervise(const LaunchOptions& options, const std::vector<std::string>& command) {
  options.validate();
  if (command.empty()) {
    throw LaunchError("no program to launch. Give it after --, e.g. "
                      "lockstep launch --nproc-per-node 2 -- ./train --max-epochs 1");
  }
  const auto parent_environment = detail::current_environment();
  const auto path = parent_environment.find("PATH");
  const std::string executable = detail::resolve_executable(
      command[0], path != parent_environment.end() ? path->second : "/usr/local/bin:/usr/bin:/bin");
  const int port = resolve_master_port(options);
  const bool own_log_dir = options.log_dir().empty();
  const LaunchOptions resolved = detail::with_private_log_dir(options);

  // One machine: the ranks meet in a private file, not on a port that listens on the network.
  const std::string store_file = resolved.nnodes() == 1 ? detail::make_private_store_file(resolved.run_id()) : "";
  const RemovedAtReturn remove_store{store_file};
  std::vector<std::map<std::string, std::string>> variables;
  for (int rank = 0; rank < resolved.nproc_per_node(); ++rank) {
    variables.push_back(worker_variables(resolved, rank, port));
    if (!store_file.empty()) variables.back()["LOCKSTEP_STORE_FILE"] = store_file;
    detail::prepare_error_file(variables.back().at("TORCHELASTIC_ERROR_FILE"));
  }

  Supervisor supervisor(resolved.grace_period());
  ForwardSignals forwarding(supervisor);
  for (int rank = 0; rank < resolved.nproc_per_node(); ++rank) {
    supervisor.spawn(rank, executable, command, detail::merged(parent_environment, variables[rank]));
  }
  const int code = supervisor.wait();
  if (const auto failed = supervisor.first_failure()) {
    const std::string& report = variables[failed->local_rank].at("TORCHELASTIC_ERROR_FILE");
    if (detail::file_exists(report)) {
      detail::say("worker local_rank=" + std::to_string(failed->local_rank) +
                  " left an error report in " + report);
    }
  }
  detail::remove_empty_log_dirs(resolved.log_dir(), resolved.nproc_per_node(), own_log_dir);
  return code;
}

}  // namespace launchers
}  // namespace lockstep
