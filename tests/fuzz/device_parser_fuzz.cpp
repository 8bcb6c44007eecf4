// The --accelerator and --devices parsers (accelerators/device_parser.h) on arbitrary strings.
// Input: one byte for the visible GPU count (0-16), then the spec.
#include <lockstep/accelerators/device_parser.h>

#include <cstdlib>
#include <set>

#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lockstep;
  using namespace lockstep::accelerators;
  if (size == 0) return 0;
  const int visible = data[0] % 17;
  const std::string spec = fuzz::text(data + 1, size - 1);
  fuzz::expect_only_lockstep_errors([&] { parse_accelerator(spec, visible); });
  fuzz::expect_only_lockstep_errors([&] {
    if (parse_cpu_devices(spec) < 1) std::abort();  // a process count is at least 1
  });
  fuzz::expect_only_lockstep_errors([&] {
    const auto ids = parse_gpu_ids(spec, visible);
    // Every id is a visible device, each at most once, and there is at least one.
    if (ids.empty() || std::set<int>(ids.begin(), ids.end()).size() != ids.size()) std::abort();
    for (int id : ids) {
      if (id < 0 || id >= visible) std::abort();
    }
  });
  fuzz::expect_only_lockstep_errors([&] { devices_per_node(Accelerator::cpu, spec, visible); });
  fuzz::expect_only_lockstep_errors([&] { devices_per_node(Accelerator::cuda, spec, visible); });
  return 0;
}
