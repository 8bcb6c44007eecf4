#include <lockstep/launchers/supervisor.h>

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <thread>

#include <lockstep/launchers/launch_error.h>

#include "process_utils.h"

namespace lockstep {
namespace launchers {

namespace {

using detail::say;
using Clock = std::chrono::steady_clock;
constexpr std::chrono::milliseconds kPollInterval(50);
constexpr std::chrono::milliseconds kSecondTerm(500);

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

std::string signal_name(int signal) {
  const char* name = ::strsignal(signal);
  return "signal " + std::to_string(signal) + (name != nullptr ? std::string(" (") + name + ")" : "");
}

// Async-signal-safe: writes `text` and then `number` to stderr.
void write_error(const char* text, int number) {
  char digits[16];
  int length = 0;
  do {
    digits[length++] = static_cast<char>('0' + number % 10);
    number /= 10;
  } while (number > 0 && length < 15);
  std::reverse(digits, digits + length);
  digits[length++] = '\n';
  if (::write(STDERR_FILENO, text, std::strlen(text)) < 0) return;
  if (::write(STDERR_FILENO, digits, static_cast<std::size_t>(length)) < 0) return;
}

// Runs in a new child: dies with the thread that forked it, closes the race where that parent
// died before prctl, and joins the job's process group (`group` 0: leads a new one).
void become_worker(pid_t parent, pid_t group) {
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) {
    write_error("lockstep: prctl(PR_SET_PDEATHSIG) failed in a new worker, errno ", errno);
    ::_exit(127);
  }
  if (::getppid() != parent) ::raise(SIGKILL);
  ::setpgid(0, group);
}

// Signals the child must not inherit as handlers: until execve, they would run the parent's
// handler in the child.
void reset_signal_handlers() {
  for (int signal = 1; signal < NSIG; ++signal) {
    struct sigaction action {};
    if (::sigaction(signal, nullptr, &action) != 0) continue;
    const bool handled = (action.sa_flags & SA_SIGINFO) != 0 ||
                         (action.sa_handler != SIG_DFL && action.sa_handler != SIG_IGN);
    if (!handled) continue;
    struct sigaction fallback {};
    fallback.sa_handler = SIG_DFL;
    sigemptyset(&fallback.sa_mask);
    ::sigaction(signal, &fallback, nullptr);
  }
}

// Blocks every signal for its lifetime, so a new child cannot run a parent's handler before it
// is ready; `previous` is the mask to restore (in the parent and, when ready, in the child).
class BlockAllSignals {
 public:
  BlockAllSignals() {
    sigset_t all;
    sigfillset(&all);
    ::pthread_sigmask(SIG_SETMASK, &all, &previous);
  }
  ~BlockAllSignals() { restore(); }
  void restore() { ::pthread_sigmask(SIG_SETMASK, &previous, nullptr); }
  BlockAllSignals(const BlockAllSignals&) = delete;
  BlockAllSignals& operator=(const BlockAllSignals&) = delete;

  sigset_t previous;
};

}  // namespace

Supervisor::Supervisor(std::chrono::milliseconds grace_period)
    : grace_period_(grace_period), owner_(::getpid()) {}

Supervisor::~Supervisor() {
  if (in_owner()) terminate_all();
}

bool Supervisor::in_owner() const { return ::getpid() == owner_; }

pid_t Supervisor::spawn(int local_rank, const std::string& executable,
                        const std::vector<std::string>& argv,
                        const std::map<std::string, std::string>& environment) {
  // Everything the child needs is built here: between fork and execve only async-signal-safe
  // calls are allowed (other threads may hold the allocator's locks).
  std::vector<std::string> entries;
  entries.reserve(environment.size());
  for (const auto& [name, value] : environment) entries.push_back(name + "=" + value);
  std::vector<char*> envp;
  for (auto& entry : entries) envp.push_back(entry.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = argv.empty() ? std::vector<std::string>{executable} : argv;
  std::vector<char*> argp;
  for (auto& arg : args) argp.push_back(arg.data());
  argp.push_back(nullptr);
  const std::string exec_failed = "lockstep: cannot execute " + executable + ", errno ";

  const pid_t parent = ::getpid();
  BlockAllSignals blocked;
  const pid_t pid = ::fork();
  if (pid < 0) {
    throw LaunchError("cannot start worker local_rank=" + std::to_string(local_rank) +
                      ": fork failed: " + std::strerror(errno) +
                      ". Lower --nproc-per-node or raise the process limit (ulimit -u).");
  }
  if (pid == 0) {
    become_worker(parent, group_);
    reset_signal_handlers();
    blocked.restore();
    ::execve(executable.c_str(), argp.data(), envp.data());
    write_error(exec_failed.c_str(), errno);
    ::_exit(127);
  }
  add_worker(local_rank, pid);
  return pid;
}

pid_t Supervisor::fork_worker(int local_rank) {
  std::cout.flush();
  std::clog.flush();
  std::fflush(nullptr);
  const pid_t parent = ::getpid();
  BlockAllSignals blocked;
  const pid_t pid = ::fork();
  if (pid < 0) {
    throw LaunchError("cannot start worker local_rank=" + std::to_string(local_rank) +
                      ": fork failed: " + std::strerror(errno) +
                      ". Lower --devices or raise the process limit (ulimit -u).");
  }
  if (pid == 0) {
    become_worker(parent, group_);
    return 0;  // `blocked` restores the mask
  }
  add_worker(local_rank, pid);
  return pid;
}

void Supervisor::add_worker(int local_rank, pid_t pid) {
  // Set here too: whichever of parent and child runs first, the group exists before the next
  // worker tries to join it.
  if (group_ == 0) {
    ::setpgid(pid, pid);
    group_ = pid;
  } else {
    ::setpgid(pid, group_);
  }
  workers_.push_back(Worker{local_rank, pid, std::nullopt});
}

int Supervisor::running() const {
  return static_cast<int>(std::count_if(workers_.begin(), workers_.end(),
                                        [](const Worker& w) { return !w.exit_code; }));
}

std::optional<Worker> Supervisor::first_failure() const {
  if (!failure_) return std::nullopt;
  return workers_[*failure_];
}

void Supervisor::reap(bool block) {
  for (std::size_t i = 0; i < workers_.size(); ++i) {
    Worker& worker = workers_[i];
    if (worker.exit_code) continue;
    int status = 0;
    pid_t result;
    do {
      result = ::waitpid(worker.pid, &status, block ? 0 : WNOHANG);
    } while (result < 0 && errno == EINTR);
    if (result == 0) continue;
    std::string what;
    if (result < 0) {
      worker.exit_code = 1;
      what = std::string("was lost: ") + std::strerror(errno) +
             " (reaped elsewhere, or SIGCHLD ignored?); counted as exit code 1";
    } else {
      worker.exit_code = exit_code_of(status);
      what = WIFSIGNALED(status) ? "was killed by " + signal_name(WTERMSIG(status)) +
                                       ", exit code " + std::to_string(*worker.exit_code)
                                 : "exited with code " + std::to_string(*worker.exit_code);
    }
    // A worker that fails while the job goes down on a forwarded signal is not its cause, nor is
    // one that stops with the code the job agreed to end with.
    const bool expected = *worker.exit_code == expected_exit_code_.load();
    if (*worker.exit_code != 0 && !expected && !failure_ && forwarded_count_ == 0) {
      failure_ = i;
      failure_text_ = what;
    }
  }
}

void Supervisor::signal_workers(int signal) {
  // Signalling the group also reaches what the workers started; it is the job's only while one
  // of its unreaped workers (even a zombie) is in it, so the id cannot have been reused.
  const bool group_is_ours =
      group_ != 0 && std::any_of(workers_.begin(), workers_.end(), [this](const Worker& w) {
        return !w.exit_code && ::getpgid(w.pid) == group_;
      });
  if (group_is_ours) ::kill(-group_, signal);
  for (const Worker& worker : workers_) {
    if (worker.exit_code) continue;
    if (group_is_ours && ::getpgid(worker.pid) == group_) continue;
    ::kill(worker.pid, signal);
  }
}

void Supervisor::finish_running(bool escalate_on_interrupt) {
  if (running() == 0) return;
  signal_workers(SIGTERM);
  // A Lockstep Trainer takes a first SIGTERM as a request to stop with the other ranks after its
  // next step (distributed::AgreedStop), which a job that lost a worker never reaches; a second
  // one ends it as SIGTERM ends other programs.
  const auto second_at = Clock::now() + kSecondTerm;
  bool second_sent = false;
  const auto kill_at = Clock::now() + grace_period_;
  const int interrupts = interrupt_count_.load();
  while (true) {
    reap(false);
    if (running() == 0) return;
    if (!second_sent && Clock::now() >= second_at) {
      signal_workers(SIGTERM);
      second_sent = true;
    }
    const bool again = escalate_on_interrupt && interrupt_count_.load() != interrupts;
    if (again || Clock::now() >= kill_at) break;
    std::this_thread::sleep_for(kPollInterval);
  }
  say("SIGKILL to " + std::to_string(running()) + " worker(s) still running after the " +
      std::to_string(grace_period_.count()) + " ms grace period");
  signal_workers(SIGKILL);
  reap(true);
}

void Supervisor::terminate_all() {
  if (!in_owner()) return;
  finish_running(true);
  failure_reported_ = true;
}

void Supervisor::expect_exit_code(int exit_code) noexcept { expected_exit_code_.store(exit_code); }

void Supervisor::interrupt(int signal) noexcept {
  interrupt_signal_.store(signal);
  interrupt_count_.fetch_add(1);
}

int Supervisor::wait() { return *wait_until(std::nullopt); }

std::optional<int> Supervisor::wait_for(std::chrono::milliseconds timeout) {
  return wait_until(Clock::now() + timeout);
}

std::optional<int> Supervisor::wait_until(std::optional<TimePoint> deadline) {
  if (!in_owner()) return 0;
  while (true) {
    forward_interrupt();
    reap(false);
    if (failure_ && !failure_reported_) {
      failure_reported_ = true;
      const Worker& failed = workers_[*failure_];
      const int others = running();
      say("worker local_rank=" + std::to_string(failed.local_rank) + " (pid " +
          std::to_string(failed.pid) + ") " + failure_text_ + "; " +
          (others > 0 ? "terminating " + std::to_string(others) + " other worker(s)"
                      : "no other worker is running"));
      finish_running(true);
    }
    if (running() == 0) {
      if (forwarded_count_ > 0) return 128 + interrupt_signal_.load();
      return failure_ ? *workers_[*failure_].exit_code : 0;
    }
    const auto now = Clock::now();
    if (kill_at_ && now >= *kill_at_) {
      say("SIGKILL to " + std::to_string(running()) + " worker(s) still running " +
          std::to_string(grace_period_.count()) + " ms after the forwarded signal");
      signal_workers(SIGKILL);
      reap(true);
      continue;
    }
    if (deadline && now >= *deadline) return std::nullopt;
    auto pause = std::chrono::duration_cast<Clock::duration>(kPollInterval);
    if (deadline) pause = std::min(pause, *deadline - now);
    std::this_thread::sleep_for(pause);
  }
}

void Supervisor::forward_interrupt() {
  const int count = interrupt_count_.load();
  if (count == forwarded_count_) return;
  const int signal = interrupt_signal_.load();
  if (forwarded_count_ == 0) {
    say("received " + signal_name(signal) + "; forwarding it to " + std::to_string(running()) +
        " worker(s)");
    signal_workers(signal);
    kill_at_ = Clock::now() + grace_period_;
  }
  // Two signals before this poll (a quick double Ctrl-C) are a second one too.
  if (count - forwarded_count_ > 1 || forwarded_count_ > 0) {
    say("received " + signal_name(signal) + " again; killing " + std::to_string(running()) +
        " worker(s)");
    kill_at_ = Clock::now();
  }
  forwarded_count_ = count;
}

}  // namespace launchers
}  // namespace lockstep
