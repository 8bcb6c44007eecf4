// A worker for the launcher tests: records its environment and pid, then does what its
// arguments say. Run by launch_and_supervise (launch_driver) or by torchrun --no_python.
//   launch_worker DIR [exit=R:C] [sleep=MS] [ignore_term=R] [record_term] [grandchild=R]
// exit=R:C: local rank R exits with C once every local rank has recorded its pid.
// Writes DIR/env.<LOCAL_RANK> (NAME=VALUE lines) and then DIR/pid.<LOCAL_RANK>, each complete
// once it exists.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

extern char** environ;

namespace {

volatile sig_atomic_t terminated = 0;
void on_term(int) { terminated = 1; }

void write_file(const std::string& path, const std::string& text) {
  const std::string partial = path + ".partial";
  { std::ofstream(partial) << text; }
  std::rename(partial.c_str(), path.c_str());
}

// "R:V" -> V when R is `rank`.
bool for_rank(const std::string& value, const std::string& rank, std::string* out) {
  const auto colon = value.find(':');
  if (colon == std::string::npos || value.substr(0, colon) != rank) return false;
  *out = value.substr(colon + 1);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 64;
  const std::string dir = argv[1];
  const char* local_rank = std::getenv("LOCAL_RANK");
  const std::string rank = local_rank != nullptr ? local_rank : "none";
  int exit_code = 0;
  long sleep_ms = 0;
  bool record_term = false;
  std::string value;
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto eq = arg.find('=');
    const std::string key = arg.substr(0, eq);
    const std::string rest = eq == std::string::npos ? "" : arg.substr(eq + 1);
    if (key == "exit" && for_rank(rest, rank, &value)) exit_code = std::atoi(value.c_str());
    if (key == "sleep") sleep_ms = std::atol(rest.c_str());
    if (key == "ignore_term" && rest == rank) ::signal(SIGTERM, SIG_IGN);
    if (key == "record_term") record_term = true;
    if (key == "grandchild" && rest == rank) {
      const pid_t child = ::fork();
      if (child == 0) {
        for (int s = 0; s < 300; ++s) ::usleep(100000);
        ::_exit(0);
      }
      write_file(dir + "/grandchild." + rank, std::to_string(child));
    }
  }
  if (record_term) ::signal(SIGTERM, on_term);

  std::string env;
  for (char** e = environ; *e != nullptr; ++e) env += std::string(*e) + "\n";
  write_file(dir + "/env." + rank, env);
  write_file(dir + "/pid." + rank, std::to_string(::getpid()));
  if (exit_code != 0) {
    // Fail only once every worker recorded its pid, so tests can check that all are gone.
    const char* size = std::getenv("LOCAL_WORLD_SIZE");
    const int workers = size != nullptr ? std::atoi(size) : 1;
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    for (int other = 0; other < workers && std::chrono::steady_clock::now() < give_up;) {
      if (::access((dir + "/pid." + std::to_string(other)).c_str(), F_OK) == 0) {
        ++other;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
    return exit_code;
  }

  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(sleep_ms);
  while (std::chrono::steady_clock::now() < until) {
    if (terminated) {
      write_file(dir + "/term." + rank, "SIGTERM");
      return 0;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return 0;
}
