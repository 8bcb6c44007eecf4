#include "local_job.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include <lockstep/launchers/launch_error.h>
#include <lockstep/launchers/launcher.h>
#include <lockstep/launchers/worker_environment.h>

#include "process_utils.h"

namespace lockstep {
namespace launchers {
namespace detail {
namespace {

// OpenBLAS and OpenMP read OMP_NUM_THREADS when they load, before this process became a worker;
// a re-executed worker starts with the value, so apply it here too. Without this, rank 0 of a
// self-launched job ran OpenBLAS with a thread per core beside the other ranks (measured: 0.85x
// the steps/s of the same job under `lockstep launch`).
void apply_thread_limit(const std::string& value) {
  int threads = 0;
  try {
    threads = std::stoi(value);
  } catch (const std::exception&) {
    return;
  }
  if (threads < 1) return;
  using SetThreads = void (*)(int);
  for (const char* name : {"openblas_set_num_threads", "omp_set_num_threads"}) {
    if (auto set = reinterpret_cast<SetThreads>(::dlsym(RTLD_DEFAULT, name))) set(threads);
  }
}


LocalJob* the_job = nullptr;

constexpr std::chrono::milliseconds kWatchInterval(50);
constexpr std::chrono::milliseconds kCauseWindow(1000);
// Set in the environment of local rank 0 when a restart starts it again: the restart's number.
constexpr const char* kRestartVariable = "LOCKSTEP_SELF_RESTART_COUNT";

void flush_everything() {
  std::cout.flush();
  std::clog.flush();
  std::fflush(nullptr);
}

void finish_at_exit() {
  LocalJob* job = LocalJob::current();
  if (job == nullptr) return;
  const int code = job->finish(job->options().exit_timeout());
  if (code == 0) return;
  flush_everything();
  std::_Exit(code);
}

}  // namespace

bool is_worker_process() {
  for (const char* name : {"RANK", "GROUP_RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE"}) {
    if (std::getenv(name) == nullptr) return false;
  }
  return true;
}

LocalJob& LocalJob::begin(const LaunchOptions& options) {
  if (the_job != nullptr) {
    throw LaunchError("this process already launched its workers (local rank 0 of run " +
                      the_job->options().run_id() + "); a process launches once.");
  }
  options.validate();
  the_job = new LocalJob(options);  // never deleted: the exit-time wait needs it after main()
  return *the_job;
}

LocalJob* LocalJob::current() { return the_job; }

LocalJob::LocalJob(const LaunchOptions& options)
    : options_(with_private_log_dir(options)),
      own_log_dir_(options.log_dir().empty()),
      owner_(::getpid()),
      supervisor_(options.grace_period()) {
  if (options_.max_restarts() > 0) {
    // Local rank 0 is this process: a restart starts the program again in its place.
    command_line_ = self_command_line();
    first_environment_ = current_environment();
    if (const char* restart = std::getenv(kRestartVariable)) {
      try {
        restart_count_ = std::min(std::max(std::stoi(restart), 0), options_.max_restarts());
      } catch (const std::exception&) {
        restart_count_ = 0;
      }
    }
  }
  const int port = resolve_master_port(options_);
  if (options_.nnodes() == 1) store_file_ = make_private_store_file(options_.run_id());
  for (int rank = 0; rank < options_.nproc_per_node(); ++rank) {
    variables_.push_back(worker_variables(options_, rank, port, restart_count_));
    if (!store_file_.empty()) variables_.back()["LOCKSTEP_STORE_FILE"] = store_file_;
    prepare_error_file(variables_.back().at("TORCHELASTIC_ERROR_FILE"));
    distributed::Placement placement;
    placement.world_size = options_.world_size();
    placement.global_rank = options_.node_rank() * options_.nproc_per_node() + rank;
    placement.local_rank = rank;
    placement.local_world_size = options_.nproc_per_node();
    placement.node_rank = options_.node_rank();
    placement.main_address = options_.master_addr();
    placement.main_port = port;
    placement.store_file = store_file_;
    placements_.push_back(placement);
  }
}

void LocalJob::export_variables(int local_rank) const {
  for (const auto& [name, value] : variables(local_rank)) ::setenv(name.c_str(), value.c_str(), 1);
  const auto& vars = variables(local_rank);
  const auto omp = vars.find("OMP_NUM_THREADS");
  if (omp != vars.end()) apply_thread_limit(omp->second);
}

void LocalJob::watch() {
  static bool registered = false;
  if (!registered) registered = std::atexit(finish_at_exit) == 0;
  if (supervisor_.workers().empty()) return;
  watcher_ = std::thread([this] {
    while (!stop_watching_.load()) {
      const auto code = supervisor_.wait_for(kWatchInterval);
      if (!code) continue;
      if (*code == 0) return;
      report_error_file();
      remove_empty_log_dirs(options_.log_dir(), options_.nproc_per_node(), 1, own_log_dir_);
      remove_private_store(store_file_);
      const auto failure = supervisor_.first_failure();
      restart_if_allowed(*code, "worker local_rank=" + std::to_string(failure ? failure->local_rank : -1) +
                                    " failed with exit code " + std::to_string(*code));
      say("ending local rank 0 (pid " + std::to_string(::getpid()) + ") with exit code " +
          std::to_string(*code));
      flush_everything();
      std::_Exit(*code);
    }
  });
}

int LocalJob::finish(std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(finish_mutex_);
  if (::getpid() != owner_) return 0;
  if (result_) return *result_;
  stop_watching_.store(true);
  if (watcher_.joinable()) watcher_.join();
  auto code = supervisor_.wait_for(timeout);
  if (!code) {
    say("local rank 0 finished, but " + std::to_string(supervisor_.running()) +
        " other worker(s) still ran " + std::to_string(timeout.count()) +
        " ms later; terminating them");
    supervisor_.terminate_all();
    const auto failure = supervisor_.first_failure();
    code = failure ? *failure->exit_code : 1;
  }
  report_error_file();
  remove_empty_log_dirs(options_.log_dir(), options_.nproc_per_node(), 1, own_log_dir_);
  remove_private_store(store_file_);
  if (*code == 0 && restart_count_ > 0) say("the job succeeded after " + std::to_string(restart_count_) + " restart(s)");
  result_ = code;
  return *code;
}

int LocalJob::end_after_own_failure(int exit_code) {
  std::lock_guard<std::mutex> lock(finish_mutex_);
  if (::getpid() != owner_ || (result_ && !ended_early_)) return exit_code;
  if (!ended_early_) {
    ended_early_ = true;
    stop_watching_.store(true);
    if (watcher_.joinable()) watcher_.join();
    // This rank's error may be the news of a worker that failed first (a peer that left the
    // reduction): a short look lets the supervisor report that worker as the cause.
    const auto code = supervisor_.wait_for(kCauseWindow);
    if (code && *code != 0) {
      worker_code_ = *code;
    } else if (supervisor_.running() > 0) {
      say("local rank 0 failed (exit code " + std::to_string(exit_code) + "); terminating " +
          std::to_string(supervisor_.running()) + " other worker(s) without waiting for them");
      supervisor_.terminate_all();
    }
    remove_empty_log_dirs(options_.log_dir(), options_.nproc_per_node(), 1, own_log_dir_);
    remove_private_store(store_file_);
    const auto failure = supervisor_.first_failure();
    restart_if_allowed(worker_code_.value_or(exit_code),
                       worker_code_ && failure ? "worker local_rank=" + std::to_string(failure->local_rank) +
                                                     " failed with exit code " + std::to_string(*worker_code_)
                                               : "local rank 0 failed with exit code " + std::to_string(exit_code));
  }
  // A later call (guarded_main's, after the Trainer's) knows this rank's code better.
  result_ = worker_code_ ? *worker_code_ : exit_code;
  return *result_;
}

void LocalJob::restart_if_allowed(int exit_code, const std::string& why) {
  if (options_.max_restarts() == 0) return;
  for (int stop : {SIGINT, SIGTERM, SIGUSR1}) {
    if (exit_code == 128 + stop) return;  // asked to end (a stop that saved last.ckpt): not a failure
  }
  if (restart_count_ >= options_.max_restarts()) {
    say("giving up after " + std::to_string(restart_count_) + " restart(s) (--max-restarts " +
        std::to_string(options_.max_restarts()) + "); " + why);
    return;
  }
  supervisor_.terminate_all();
  say("restarting the job (restart " + std::to_string(restart_count_ + 1) + " of " +
      std::to_string(options_.max_restarts()) + ") after " + why + ": " + command_line_.front() +
      " starts again");
  flush_everything();
  auto environment = first_environment_;
  environment[kRestartVariable] = std::to_string(restart_count_ + 1);
  std::vector<std::string> entries;
  for (const auto& [name, value] : environment) entries.push_back(name + "=" + value);
  std::vector<char*> argv, envp;
  for (auto& arg : command_line_) argv.push_back(arg.data());
  argv.push_back(nullptr);
  for (auto& entry : entries) envp.push_back(entry.data());
  envp.push_back(nullptr);
  ::execve("/proc/self/exe", argv.data(), envp.data());
  say("could not start the program again (" + std::string(std::strerror(errno)) + "); ending with exit code " +
      std::to_string(exit_code));
}

void LocalJob::report_error_file() const {
  const auto failure = supervisor_.first_failure();
  if (!failure) return;
  const std::string& report = variables(failure->local_rank).at("TORCHELASTIC_ERROR_FILE");
  if (file_exists(report)) {
    say("worker local_rank=" + std::to_string(failure->local_rank) + " left an error report in " +
        report);
  }
}

}  // namespace detail

int end_launched_job(int exit_code) {
  detail::LocalJob* job = detail::LocalJob::current();
  return job == nullptr ? exit_code : job->end_after_own_failure(exit_code);
}

void expect_launched_job_exit(int exit_code) {
  detail::LocalJob* job = detail::LocalJob::current();
  // In a forked worker the copy of the job is never used: harmless there.
  if (job != nullptr) job->supervisor().expect_exit_code(exit_code);
}

}  // namespace launchers
}  // namespace lockstep
