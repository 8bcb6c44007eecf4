#pragma once
/// Supervisor: starts worker processes and brings the job down when one of them fails.

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace lockstep {
namespace launchers {

/// One worker process of a Supervisor.
struct Worker {
  int local_rank = 0;
  pid_t pid = 0;
  /// Set once the worker is reaped: its exit status, or 128+S when signal S killed it.
  std::optional<int> exit_code;
};

/// Starts the worker processes of one node and supervises them. Each worker:
/// - dies with SIGKILL when the thread that started it ends (PR_SET_PDEATHSIG), so a launcher
///   killed outright takes its workers along; call `spawn`/`fork_worker` from a thread that lives
///   as long as the job (the main thread);
/// - joins the job's process group (led by the first worker), so signals reach what the
///   workers start themselves. A worker that reads the terminal therefore stops (SIGTTIN).
/// When one worker exits non-zero, the others get SIGTERM, a second SIGTERM 0.5 s later (a
/// Lockstep Trainer takes the first as a request to stop together), and, after the grace period,
/// SIGKILL;
/// every worker is reaped, and the job's exit code is the failed worker's. Polls with waitpid
/// every 50 ms. Not thread-safe: use it from one thread at a time.
/// ```
///   Supervisor supervisor(std::chrono::milliseconds(2000));
///   supervisor.spawn(0, "/usr/bin/env", {"env"}, environment);
///   int code = supervisor.wait();
/// ```
class Supervisor {
 public:
  /// `grace_period`: time between SIGTERM and SIGKILL. Default: 5000 ms.
  explicit Supervisor(std::chrono::milliseconds grace_period = std::chrono::milliseconds(5000));
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;
  /// Terminates and reaps the workers still running. In a forked copy of the process, does
  /// nothing: a Supervisor acts only in the process that made it.
  ~Supervisor();

  /// Starts `executable` (a path; no PATH search) with `argv` (argv[0] included) and exactly
  /// `environment`, as local rank `local_rank`. Returns its pid. Throws LaunchError when fork
  /// fails; an exec failure is the worker's exit code 127.
  pid_t spawn(int local_rank, const std::string& executable, const std::vector<std::string>& argv,
              const std::map<std::string, std::string>& environment);

  /// Forks the calling process as local rank `local_rank`, like `fork()`: returns the child's pid
  /// in the parent and 0 in the child, which keeps the parent's signal handlers and must not use
  /// this Supervisor. Flushes stdio first so buffered output is not written twice.
  pid_t fork_worker(int local_rank);

  /// Blocks until every worker has exited 0 (returns 0) or one has failed (terminates the
  /// others, reaps them, returns the failed worker's code).
  int wait();

  /// Like `wait()`, but returns std::nullopt when workers still run after `timeout`; those keep
  /// running.
  std::optional<int> wait_for(std::chrono::milliseconds timeout);

  /// SIGTERM to every running worker (again 0.5 s later), SIGKILL after the grace period to those
  /// left, reaps all.
  void terminate_all();

  /// Async-signal-safe: makes `wait()` forward `signal` to the workers, reap them (SIGKILL after
  /// the grace period; at once when interrupted twice) and return 128+signal.
  void interrupt(int signal) noexcept;

  /// Thread-safe: the job is ending on purpose with `exit_code` (every rank stops after a signal);
  /// from now on a worker that exits with it is not a failure: it is neither reported nor ends
  /// the others, and `wait()` returns 0 once all exited so.
  void expect_exit_code(int exit_code) noexcept;

  /// Every worker started, in start order.
  const std::vector<Worker>& workers() const { return workers_; }
  /// Workers not yet reaped.
  int running() const;
  /// The first worker that exited non-zero, if any.
  std::optional<Worker> first_failure() const;

 private:
  using TimePoint = std::chrono::steady_clock::time_point;
  std::optional<int> wait_until(std::optional<TimePoint> deadline);
  void forward_interrupt();
  void reap(bool block);
  void signal_workers(int signal);
  void finish_running(bool escalate_on_interrupt);
  void add_worker(int local_rank, pid_t pid);
  bool in_owner() const;

  std::chrono::milliseconds grace_period_;
  pid_t owner_;
  pid_t group_ = 0;
  std::vector<Worker> workers_;
  std::optional<std::size_t> failure_;
  std::string failure_text_;
  bool failure_reported_ = false;
  std::atomic<int> interrupt_signal_{0};
  std::atomic<int> interrupt_count_{0};
  int forwarded_count_ = 0;
  std::atomic<int> expected_exit_code_{0};  // 0: none
  std::optional<TimePoint> kill_at_;
};

}  // namespace launchers
}  // namespace lockstep
