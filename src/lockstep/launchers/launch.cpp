#include <lockstep/launchers/launch.h>

#include <signal.h>

#include <array>
#include <atomic>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <lockstep/launchers/launch_error.h>
#include <lockstep/launchers/supervisor.h>
#include <lockstep/launchers/worker_environment.h>

#include "process_utils.h"

namespace lockstep {
namespace launchers {

namespace {

using detail::say;

std::atomic<bool> launch_running{false};
std::atomic<Supervisor*> active_supervisor{nullptr};
std::atomic<int> received_signal{0};

void forward_to_workers(int signal) {
  received_signal.store(signal);
  if (Supervisor* supervisor = active_supervisor.load()) supervisor->interrupt(signal);
}

// While alive: SIGINT, SIGTERM and SIGHUP go to the current attempt's workers (SignalsGoTo)
// instead of ending this process, and SIGCHLD is not ignored (the kernel would reap the workers
// and lose their codes).
class ForwardSignals {
 public:
  ForwardSignals() {
    if (launch_running.exchange(true)) {
      throw LaunchError("launch_and_supervise is already running in this process; "
                        "run one launch at a time.");
    }
    received_signal.store(0);
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
    launch_running.store(false);
  }
  ForwardSignals(const ForwardSignals&) = delete;
  ForwardSignals& operator=(const ForwardSignals&) = delete;

 private:
  static constexpr std::array<int, 3> kForwarded = {SIGINT, SIGTERM, SIGHUP};
  std::array<struct sigaction, 3> previous_{};
  struct sigaction previous_child_ {};
};

// While alive, the forwarded signals reach `supervisor`.
class SignalsGoTo {
 public:
  explicit SignalsGoTo(Supervisor& supervisor) { active_supervisor.store(&supervisor); }
  ~SignalsGoTo() { active_supervisor.store(nullptr); }
  SignalsGoTo(const SignalsGoTo&) = delete;
  SignalsGoTo& operator=(const SignalsGoTo&) = delete;
};

// The private rendezvous folder goes when the attempt returns or throws.
struct RemovedAtReturn {
  const std::string& store_file;
  ~RemovedAtReturn() { detail::remove_private_store(store_file); }
};

struct Attempt {
  int code = 0;
  std::optional<Worker> failure;  // the worker that failed first, if one did
};

std::string failure_text(const Worker& worker) {
  return "worker local_rank=" + std::to_string(worker.local_rank) + " failed with exit code " +
         std::to_string(*worker.exit_code);
}

// One start of all the workers, as attempt `restart`: a new port (when master_port is 0) and a
// new rendezvous file, so no rank reads the keys of the attempt before.
Attempt run_attempt(const LaunchOptions& options, const std::string& executable,
                    const std::vector<std::string>& command,
                    const std::map<std::string, std::string>& parent_environment, int restart) {
  const int port = resolve_master_port(options);
  // One machine: the ranks meet in a private file, not on a port that listens on the network.
  const std::string store_file = options.nnodes() == 1 ? detail::make_private_store_file(options.run_id()) : "";
  const RemovedAtReturn remove_store{store_file};
  std::vector<std::map<std::string, std::string>> variables;
  for (int rank = 0; rank < options.nproc_per_node(); ++rank) {
    variables.push_back(worker_variables(options, rank, port, restart));
    if (!store_file.empty()) variables.back()["LOCKSTEP_STORE_FILE"] = store_file;
    detail::prepare_error_file(variables.back().at("TORCHELASTIC_ERROR_FILE"));
  }

  Supervisor supervisor(options.grace_period());
  const SignalsGoTo forwarding(supervisor);
  // A signal that came between attempts, before `forwarding`, stops the job before it starts.
  if (const int signal = received_signal.load()) return {128 + signal, std::nullopt};
  for (int rank = 0; rank < options.nproc_per_node(); ++rank) {
    supervisor.spawn(rank, executable, command, detail::merged(parent_environment, variables[rank]));
  }
  const int code = supervisor.wait();
  const auto failed = supervisor.first_failure();
  if (failed) {
    const std::string& report = variables[failed->local_rank].at("TORCHELASTIC_ERROR_FILE");
    if (detail::file_exists(report)) {
      say("worker local_rank=" + std::to_string(failed->local_rank) + " left an error report in " + report);
    }
  }
  return {code, failed};
}

// The last word of a job that may restart: how it ended and after how many restarts.
// `same_failure`: the failure of every attempt, or "" when they differed.
void say_outcome(const Attempt& last, int restarts, int max_restarts, const std::string& same_failure) {
  const std::string count = std::to_string(restarts) + " restart(s)";
  if (last.code == 0) {
    if (restarts > 0) say("the job succeeded after " + count);
  } else if (const int signal = received_signal.load()) {
    say("not restarting: this launcher received signal " + std::to_string(signal) + " (after " + count +
        " of " + std::to_string(max_restarts) + ")");
  } else if (last.failure) {
    say("giving up after " + count + " (--max-restarts " + std::to_string(max_restarts) + "); " +
        (same_failure.empty() ? "the last attempt ended when " + failure_text(*last.failure)
                              : same_failure + " every time"));
  }
}

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
  const bool own_log_dir = options.log_dir().empty();
  const LaunchOptions resolved = detail::with_private_log_dir(options);
  const int nproc = resolved.nproc_per_node();
  const int max_restarts = resolved.max_restarts();

  const ForwardSignals forwarding;
  int restart = 0;
  Attempt attempt = run_attempt(resolved, executable, command, parent_environment, restart);
  std::string same_failure = attempt.failure ? failure_text(*attempt.failure) : "";
  while (attempt.failure && restart < max_restarts && received_signal.load() == 0) {
    ++restart;
    say("restarting all " + std::to_string(nproc) + " worker(s) (restart " + std::to_string(restart) +
        " of " + std::to_string(max_restarts) + ") after " + failure_text(*attempt.failure));
    attempt = run_attempt(resolved, executable, command, parent_environment, restart);
    if (!attempt.failure || failure_text(*attempt.failure) != same_failure) same_failure.clear();
  }
  if (max_restarts > 0) say_outcome(attempt, restart, max_restarts, same_failure);
  detail::remove_empty_log_dirs(resolved.log_dir(), nproc, restart + 1, own_log_dir);
  return attempt.code;
}

}  // namespace launchers
}  // namespace lockstep
