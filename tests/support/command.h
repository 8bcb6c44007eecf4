#pragma once
// Runs a program to completion with an exact environment, capturing stdout and stderr, bounded
// by a timeout (the process is SIGKILLed and reaped if it runs over).

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace lockstep {
namespace testing {

struct CommandResult {
  int exit_code = -1;  // 128+S for a signal, -1 if it timed out or could not start
  std::string out;
  std::string err;
  std::vector<std::string> out_lines() const {
    std::vector<std::string> lines;
    std::istringstream in(out);
    for (std::string line; std::getline(in, line);) {
      if (!line.empty()) lines.push_back(line);
    }
    return lines;
  }
};

inline std::string slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

/// A program started by start_command: its pid (the leader of its own process group) and where
/// its output goes.
struct StartedCommand {
  pid_t pid = -1;
  std::string dir;
};

/// Starts `argv` in a process group of its own (kill(-pid, ...) reaches its workers too).
inline StartedCommand start_command(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env) {
  char pattern[] = "/tmp/lockstep_cmd_XXXXXX";
  StartedCommand started;
  started.dir = ::mkdtemp(pattern);
  const std::string out_path = started.dir + "/out", err_path = started.dir + "/err";
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
  // Under scripts/test --sanitize the sanitizers' options (suppressions) reach every program.
  for (const char* name : {"ASAN_OPTIONS", "LSAN_OPTIONS", "UBSAN_OPTIONS"}) {
    const char* value = std::getenv(name);
    if (value != nullptr && env.count(name) == 0) env_strings.push_back(std::string(name) + "=" + value);
  }
  std::vector<char*> envp, args;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = argv;
  for (auto& s : argv_copy) args.push_back(s.data());
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  // The stop signals at their defaults and none blocked, whatever the test runner has (a shell
  // ignores SIGINT in what it starts with `&`): the programs' own handling is what is tested.
  sigset_t defaults, none;
  sigemptyset(&defaults);
  sigemptyset(&none);
  for (int signal : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2}) sigaddset(&defaults, signal);
  posix_spawnattr_setsigdefault(&attributes, &defaults);
  posix_spawnattr_setsigmask(&attributes, &none);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
  posix_spawnattr_setpgroup(&attributes, 0);
  if (posix_spawn(&started.pid, args[0], &actions, &attributes, args.data(), envp.data()) != 0) started.pid = -1;
  posix_spawnattr_destroy(&attributes);
  posix_spawn_file_actions_destroy(&actions);
  return started;
}

/// Waits for a started program; SIGKILLs its process group if it runs over `timeout`.
inline CommandResult finish_command(const StartedCommand& started, std::chrono::milliseconds timeout) {
  CommandResult result;
  if (started.pid > 0) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    int status = 0;
    while (::waitpid(started.pid, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(-started.pid, SIGKILL);
        ::waitpid(started.pid, &status, 0);
        status = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (status != -1) result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  result.out = slurp(started.dir + "/out");
  result.err = slurp(started.dir + "/err");
  std::error_code ignored;
  std::filesystem::remove_all(started.dir, ignored);
  return result;
}

inline CommandResult run_command(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
                                 std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  return finish_command(start_command(argv, env), timeout);
}

}  // namespace testing
}  // namespace lockstep
