#pragma once
// Real processes for the launcher tests: start a program, wait for it with a bound, check that
// pids are gone, read the files the helper programs (tests/programs/launch_*.cpp) write.

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../../support/paths.h"
#include "../../support/temp_dir.h"

extern char** environ;

namespace lockstep {
namespace testing {

using Clock = std::chrono::steady_clock;

/// Path of a helper program built from tests/programs/NAME.cpp.
inline std::string program(const std::string& name) {
  return std::string(LOCKSTEP_BIN_DIR) + "/../tests/" + name;
}

/// Makes the test process adopt orphaned descendants (PR_SET_CHILD_SUBREAPER), so a worker that
/// outlived its launcher can be reaped here and `kill(pid, 0)` tells "gone" from "zombie".
inline void become_subreaper() { ::prctl(PR_SET_CHILD_SUBREAPER, 1); }

/// A started process; its stderr goes to a file (`stderr_text()`).
struct Process {
  pid_t pid = -1;
  std::string stderr_path;
  std::string stderr_text() const {
    std::ifstream in(stderr_path);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
};

/// Starts `argv` with this process's environment plus `extra`, stderr into `stderr_path`.
inline Process start(const std::vector<std::string>& argv, const std::string& stderr_path,
                     const std::map<std::string, std::string>& extra = {}) {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry(*e);
    const auto eq = entry.find('=');
    if (eq != std::string::npos) env[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  for (const auto& [k, v] : extra) env[k] = v;
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp, args;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = argv;
  for (auto& s : argv_copy) args.push_back(s.data());
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, stderr_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  Process process;
  process.stderr_path = stderr_path;
  if (posix_spawn(&process.pid, args[0], &actions, nullptr, args.data(), envp.data()) != 0) {
    process.pid = -1;
  }
  posix_spawn_file_actions_destroy(&actions);
  return process;
}

/// Exit code of `pid` (128+S for signal S), or nullopt if it still runs after `timeout`; then it
/// is SIGKILLed and reaped so no test leaves it behind.
inline std::optional<int> wait_exit(pid_t pid, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (true) {
    int status = 0;
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) {
      if (WIFEXITED(status)) return WEXITSTATUS(status);
      if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
      return std::nullopt;
    }
    if (r < 0) return std::nullopt;
    if (Clock::now() >= deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return std::nullopt;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

/// True when no process `pid` exists (reaping it first when it is an adopted zombie).
inline bool gone(pid_t pid) {
  if (pid <= 0) return false;  // kill(0 or -1, 0) would ask about whole groups
  int status = 0;
  ::waitpid(pid, &status, WNOHANG);
  return ::kill(pid, 0) == -1 && errno == ESRCH;
}

/// True when every pid is gone within `timeout`.
inline bool all_gone_within(const std::vector<pid_t>& pids, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (true) {
    bool all = true;
    for (pid_t pid : pids) all = gone(pid) && all;
    if (all) return true;
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

/// SIGKILLs every pid still alive (cleanup after a failed test).
inline void kill_all(const std::vector<pid_t>& pids) {
  for (pid_t pid : pids) {
    if (pid > 0 && !gone(pid)) ::kill(pid, SIGKILL);
  }
}

inline bool exists(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0;
}

/// Waits until every path exists; false after `timeout`.
inline bool wait_for_files(const std::vector<std::string>& paths, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (true) {
    bool all = true;
    for (const auto& p : paths) all = all && exists(p);
    if (all) return true;
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

/// NAME=VALUE lines of a file as a map (what the helper programs write).
inline std::map<std::string, std::string> read_variables(const std::string& path) {
  std::map<std::string, std::string> vars;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    const auto eq = line.find('=');
    if (eq != std::string::npos) vars[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return vars;
}

inline pid_t read_pid(const std::string& path) {
  return static_cast<pid_t>(std::atol(read_text(path).c_str()));
}

inline std::set<std::string> names(const std::map<std::string, std::string>& vars) {
  std::set<std::string> out;
  for (const auto& [k, v] : vars) out.insert(k);
  return out;
}

inline long elapsed_ms(Clock::time_point since) {
  return static_cast<long>(
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - since).count());
}

}  // namespace testing
}  // namespace lockstep
