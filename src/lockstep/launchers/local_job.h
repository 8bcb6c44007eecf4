#pragma once
// The job of an in-process launcher (subprocess, fork): this process is local rank 0 and
// supervises local ranks 1..N-1 from a background thread.

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <lockstep/distributed/placement.h>
#include <lockstep/launchers/launch_options.h>
#include <lockstep/launchers/supervisor.h>

namespace lockstep {
namespace launchers {
namespace detail {

/// Whether this process already is a worker of a job (torchrun's or ours): RANK, GROUP_RANK,
/// LOCAL_RANK and LOCAL_WORLD_SIZE are all set.
bool is_worker_process();

/// At most one per process, made by `begin`, never destroyed: it must outlive main() for the
/// exit-time wait.
class LocalJob {
 public:
  /// Validates `options`, resolves the port and log folder and computes every local rank's
  /// variables. Throws LaunchError when this process already began a job.
  static LocalJob& begin(const LaunchOptions& options);
  /// The job this process began, or nullptr.
  static LocalJob* current();

  const LaunchOptions& options() const { return options_; }
  const std::map<std::string, std::string>& variables(int local_rank) const {
    return variables_.at(local_rank);
  }
  Supervisor& supervisor() { return supervisor_; }

  /// Where `local_rank` sits: the values of its variables.
  const distributed::Placement& placement(int local_rank) const { return placements_.at(local_rank); }
  /// Writes `local_rank`'s variables into this process's environment.
  void export_variables(int local_rank) const;
  /// Starts the thread that ends the whole process with a failed worker's exit code, and makes
  /// `finish(options.exit_timeout())` run at exit. Call on the thread that started the workers.
  void watch();
  /// Waits up to `timeout` for the workers, terminates those still running, returns the job's
  /// code (0, the first failure's, or 1 when workers had to be terminated and exited 0). Runs
  /// once; later calls return the first result. Returns 0 in a forked worker.
  int finish(std::chrono::milliseconds timeout);
  /// Local rank 0 failed with `exit_code`: terminates the workers now (they are not blamed) and
  /// makes `exit_code` what finish() returns, unless a worker failed within a second before or
  /// after (the likelier cause), whose failure is reported and whose code is the job's. Returns
  /// the job's code.
  int end_after_own_failure(int exit_code);
  /// This process's attempt: 0, or the restart it was started as (LOCKSTEP_SELF_RESTART_COUNT).
  int restart_count() const { return restart_count_; }

 private:
  explicit LocalJob(const LaunchOptions& options);
  void report_error_file() const;
  /// With restarts left and a failure that is not a stop (128 + SIGINT, SIGTERM or SIGUSR1: the
  /// job was asked to end), ends the workers and starts this program again in place of this
  /// process (execve; the same command line and the environment it started with), as the next
  /// restart. Returns only when it does not restart.
  void restart_if_allowed(int exit_code, const std::string& why);

  LaunchOptions options_;
  bool own_log_dir_;
  pid_t owner_;
  std::vector<std::map<std::string, std::string>> variables_;
  std::vector<distributed::Placement> placements_;
  std::string store_file_;  // one machine: the ranks' rendezvous file (LOCKSTEP_STORE_FILE)
  Supervisor supervisor_;
  std::thread watcher_;
  std::atomic<bool> stop_watching_{false};
  // Guards result_, ended_early_ and worker_code_: finish() (local rank 0's main thread, or the
  // atexit handler) and end_after_own_failure() may race; watcher_ (which ends the process when
  // a worker fails) is stopped and joined under it before either reads the supervisor.
  std::mutex finish_mutex_;
  std::optional<int> result_;
  bool ended_early_ = false;        // end_after_own_failure ran
  std::optional<int> worker_code_;  // a worker failed first: its code is the job's
  int restart_count_ = 0;
  std::vector<std::string> command_line_;                // restarts: what runs again
  std::map<std::string, std::string> first_environment_;  // restarts: before export_variables
};

}  // namespace detail
}  // namespace launchers
}  // namespace lockstep
