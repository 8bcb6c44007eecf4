// Cluster environment detection (environments/cluster_environment.h) on arbitrary variables:
// input lines KEY=VALUE, as `env` prints them. Every environment either describes a valid
// placement or is an EnvironmentError.
#include <lockstep/environments/cluster_environment.h>

#include <cstdlib>
#include <map>
#include <sstream>

#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lockstep;
  std::map<std::string, std::string> vars;
  std::istringstream lines(fuzz::text(data, size));
  for (std::string line; std::getline(lines, line);) {
    const auto eq = line.find('=');
    if (eq != std::string::npos && eq > 0) vars[line.substr(0, eq)] = line.substr(eq + 1);
  }
  fuzz::expect_only_lockstep_errors([&] {
    const auto env = environments::detect_environment(environments::Environ(vars));
    const auto& p = env->placement();
    if (p.world_size < 1 || p.global_rank < 0 || p.global_rank >= p.world_size || p.local_rank < 0 ||
        p.node_rank < 0 || p.main_port < 0 || p.main_port > 65535) {
      std::abort();
    }
    env->describe();
    env->process_group_options();
  });
  return 0;
}
