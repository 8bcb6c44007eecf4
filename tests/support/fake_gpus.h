#pragma once
// A stand-in for probing CUDA devices, for the device-selection tests on a CPU-only build.

#include <map>
#include <set>

#include <lockstep/accelerators/device_parser.h>

namespace lockstep {
namespace testing {

/// Devices in `busy` are taken; every probe is counted per device.
struct FakeGpus {
  std::set<int> busy;
  std::map<int, int> probed;
  accelerators::DeviceProbe probe() {
    return [this](int id) {
      ++probed[id];
      return busy.count(id) == 0;
    };
  }
  int calls() const {
    int n = 0;
    for (const auto& [id, count] : probed) n += count;
    return n;
  }
};

}  // namespace testing
}  // namespace lockstep
