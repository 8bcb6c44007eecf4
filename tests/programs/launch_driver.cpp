// Runs launch_and_supervise as `lockstep launch` does, for the launcher tests:
//   launch_driver NPROC GRACE_MS PORT [MAX_RESTARTS] -- PROGRAM ARGS...
// Exits with the job's code; 2 on a LaunchError.
#include <lockstep/launchers/launch.h>
#include <lockstep/launchers/launch_error.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  using namespace lockstep::launchers;
  const int separator = argc > 4 && std::string(argv[4]) == "--" ? 4 : 5;
  if (argc < separator + 2 || std::string(argv[separator]) != "--") {
    std::fprintf(stderr, "usage: launch_driver NPROC GRACE_MS PORT [MAX_RESTARTS] -- PROGRAM ARGS...\n");
    return 64;
  }
  const auto options = LaunchOptions()
                           .nproc_per_node(std::atoi(argv[1]))
                           .grace_period(std::chrono::milliseconds(std::atol(argv[2])))
                           .master_port(std::atoi(argv[3]))
                           .max_restarts(separator == 5 ? std::atoi(argv[4]) : 0);
  const std::vector<std::string> command(argv + separator + 1, argv + argc);
  try {
    return launch_and_supervise(options, command);
  } catch (const LaunchError& error) {
    std::fprintf(stderr, "launch_driver: %s\n", error.what());
    return 2;
  }
}
