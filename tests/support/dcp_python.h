#pragma once
// The Python peer of the torch.distributed.checkpoint (DCP) tests: one whose torch has DCP's
// get_state_dict and FSDP2's fully_shard (2.4 and later). The format is the point, so on the
// LibTorch 1.13 line (whose Python has torch 1.13) the peer is the 2.x venv when it is there:
// LOCKSTEP_DCP_PYTHON if set, else this build's parity Python, else .venv-libtorch2/bin/python of
// the checkout (scripts/test-libtorch2 installs it).

#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "command.h"
#include "paths.h"

namespace lockstep {
namespace testing {

/// The first candidate that imports DCP and FSDP2, or "" (the test skips, naming what it tried).
inline std::string dcp_python(std::string* tried = nullptr) {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("LOCKSTEP_DCP_PYTHON")) candidates.push_back(env);
  candidates.push_back(LOCKSTEP_TEST_PYTHON);
  candidates.push_back(std::string(LOCKSTEP_SOURCE_DIR) + "/.venv-libtorch2/bin/python");
  for (const auto& python : candidates) {
    if (tried) *tried += (tried->empty() ? "" : ", ") + python;
    if (::access(python.c_str(), X_OK) != 0) continue;
    const auto probe = run_command(
        {python, "-c", "import torch.distributed.checkpoint.state_dict; from torch.distributed.fsdp import fully_shard"},
        {{"OMP_NUM_THREADS", "1"}}, std::chrono::seconds(60));
    if (probe.exit_code == 0) return python;
  }
  return "";
}

}  // namespace testing
}  // namespace lockstep

/// In a test body: declares `python`, DCP's Python peer, or skips the test naming what it tried.
#define LOCKSTEP_REQUIRE_DCP_PYTHON(python)                                                          \
  std::string python##_tried;                                                                        \
  const std::string python = ::lockstep::testing::dcp_python(&python##_tried);                       \
  if (python.empty()) GTEST_SKIP() << "no Python with torch.distributed.checkpoint and FSDP2 (tried " \
                                   << python##_tried << ")"
