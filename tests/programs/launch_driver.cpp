// Runs launch_and_supervise as `lockstep launch` does, for the launcher tests:
//   launch_driver NPROC GRACE_MS PORT -- PROGRAM ARGS...
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
  if (argc < 6 || std::string(argv[4]) != "--") {
    std::fprintf(stderr, "usage: launch_driver NPROC GRACE_MS PORT -- PROGRAM ARGS...\n");
    return 64;
  }
  const auto options = LaunchOptions()
                           .nproc_per_node(std::atoi(argv[1]))
                           .grace_period(std::chrono::milliseconds(std::atol(argv[2])))
                           .master_port(std::atoi(argv[3]));
  const std::vector<std::string> command(argv + 5, argv + argc);
  try {
    return launch_and_supervise(options, command);
  } catch (const LaunchError& error) {
    std::fprintf(stderr, "launch_driver: %s\n", error.what());
    return 2;
  }
}
