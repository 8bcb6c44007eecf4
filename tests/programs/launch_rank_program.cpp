// A training-program stand-in for the in-process launcher tests:
//   launch_rank_program DIR subprocess|fork NPROC [fail=R:C] [sleep=R:MS] [exit_timeout=MS]
//                       [grace=MS] [thread_first] [scrub] [marker...]
// Launches with LocalLauncher (re-exec or fork), then every rank writes DIR/rank.<RANK>
// (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, PID, PPID, ARGS), sleeps when asked,
// writes DIR/done.<RANK> and exits (with C when asked). thread_first starts a thread before
// launching; a LaunchError is written to DIR/error and exits 2. scrub overwrites the words after
// it with 'x' in place before launching (as a program hiding a secret would); START_ARGS is argv
// as the rank started.
#include <lockstep/launchers/local_launcher.h>
#include <lockstep/launchers/launch_error.h>

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace {

void write_file(const std::string& path, const std::string& text) {
  const std::string partial = path + ".partial";
  { std::ofstream(partial) << text; }
  std::rename(partial.c_str(), path.c_str());
}

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

bool for_rank(const std::string& value, const std::string& rank, std::string* out) {
  const auto colon = value.find(':');
  if (colon == std::string::npos || value.substr(0, colon) != rank) return false;
  *out = value.substr(colon + 1);
  return true;
}

// "RANK LOCAL_RANK WORLD_SIZE MASTER_ADDR MASTER_PORT" as launch() returned them, or "none".
std::string describe(const std::optional<lockstep::distributed::Placement>& p) {
  if (!p) return "none";
  return std::to_string(p->global_rank) + " " + std::to_string(p->local_rank) + " " + std::to_string(p->world_size) +
         " " + p->main_address + " " + std::to_string(p->main_port);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace lockstep::launchers;
  if (argc < 4) return 64;
  const std::string dir = argv[1];
  const std::string kind = argv[2];
  auto options = LaunchOptions().nproc_per_node(std::atoi(argv[3]));
  bool thread_first = false;
  std::string start_args;
  for (int i = 0; i < argc; ++i) start_args += std::string(i > 0 ? " " : "") + argv[i];
  bool scrubbing = false;
  for (int i = 4; i < argc; ++i) {
    if (scrubbing) {
      for (char* c = argv[i]; *c != '\0'; ++c) *c = 'x';
    }
    if (std::string(argv[i]) == "scrub") scrubbing = true;
  }
  for (int i = 4; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("exit_timeout=", 0) == 0) {
      options.exit_timeout(std::chrono::milliseconds(std::atol(arg.c_str() + 13)));
    }
    if (arg.rfind("grace=", 0) == 0) options.grace_period(std::chrono::milliseconds(std::atol(arg.c_str() + 6)));
    if (arg == "thread_first") thread_first = true;
  }

  std::mutex mutex;
  std::condition_variable released;
  bool release = false;
  std::thread helper;
  if (thread_first) {
    helper = std::thread([&] {
      std::unique_lock<std::mutex> lock(mutex);
      released.wait(lock, [&] { return release; });
    });
  }
  auto launcher = std::make_unique<LocalLauncher>(options, kind == "fork" ? StartMethod::fork : StartMethod::reexec);
  int code = 0;
  std::optional<lockstep::distributed::Placement> placement;
  try {
    placement = launcher->launch();
  } catch (const LaunchError& error) {
    write_file(dir + "/error", error.what());
    code = 2;
  }
  if (helper.joinable()) {
    { std::lock_guard<std::mutex> lock(mutex); release = true; }
    released.notify_all();
    helper.join();
  }
  if (code != 0) return code;

  const std::string rank = env("RANK");
  std::string args;
  for (int i = 0; i < argc; ++i) args += std::string(i > 0 ? " " : "") + argv[i];
  write_file(dir + "/rank." + rank,
             "RANK=" + rank + "\nLOCAL_RANK=" + env("LOCAL_RANK") + "\nWORLD_SIZE=" +
                 env("WORLD_SIZE") + "\nMASTER_ADDR=" + env("MASTER_ADDR") + "\nMASTER_PORT=" +
                 env("MASTER_PORT") + "\nPID=" + std::to_string(::getpid()) + "\nPPID=" +
                 std::to_string(::getppid()) + "\nLAUNCHER=" + launcher->name() + "\nARGS=" +
                 args + "\nSTART_ARGS=" + start_args + "\nPLACEMENT=" + describe(placement) + "\n");
  std::string value;
  for (int i = 4; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("sleep=", 0) == 0 && for_rank(arg.substr(6), rank, &value)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(std::atol(value.c_str())));
    }
  }
  write_file(dir + "/done." + rank, "done");
  for (int i = 4; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("fail=", 0) == 0 && for_rank(arg.substr(5), rank, &value)) {
      return std::atoi(value.c_str());
    }
  }
  return 0;
}
