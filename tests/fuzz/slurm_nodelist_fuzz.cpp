// SLURM hostlist expansion (environments/slurm_environment.h) on arbitrary strings: it expands
// or refuses, and first_slurm_host agrees with the expansion's first host.
#include <lockstep/environments/slurm_environment.h>

#include <cstdlib>

#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lockstep;
  const std::string nodelist = fuzz::text(data, size);
  std::vector<std::string> hosts;
  bool expanded = false;
  fuzz::expect_only_lockstep_errors([&] {
    hosts = environments::expand_slurm_nodelist(nodelist);
    expanded = true;
  });
  bool first_found = false;
  std::string first;
  fuzz::expect_only_lockstep_errors([&] {
    first = environments::first_slurm_host(nodelist);
    first_found = true;
  });
  if (expanded != first_found) std::abort();  // both accept a list or both refuse it
  if (expanded && (hosts.empty() || hosts.front() != first)) std::abort();
  for (const auto& host : hosts) {
    if (host.empty()) std::abort();
  }
  return 0;
}
