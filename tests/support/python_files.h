#pragma once
// Files that Python's torch.save writes, for the tests that load them: a script run by the parity
// Python (LOCKSTEP_TEST_PYTHON) writes them into a folder and prints the outputs C++ must match.

#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "command.h"
#include "paths.h"

namespace lockstep {
namespace testing {

struct PythonFiles {
  CommandResult command;        // the script's exit code and streams
  bool has_torch = true;        // false: that Python has no torch module (the test skips)
  std::vector<float> printed;   // the numbers the script printed, in order (float.hex() words)
};

/// Runs the Python `script` with `dir` as its argument (sys.argv[1]) and HOME, one thread, for at
/// most a minute.
/// Example: `const auto files = python_files(kPythonWriter, dir.path());`, then
/// `if (!files.has_torch) GTEST_SKIP() << ...;` and `ASSERT_EQ(files.command.exit_code, 0)`.
inline PythonFiles python_files(const std::string& script, const std::string& dir) {
  PythonFiles files;
  files.command = run_command({LOCKSTEP_TEST_PYTHON, "-c", script, dir}, {{"OMP_NUM_THREADS", "1"}, {"HOME", dir}},
                              std::chrono::seconds(60));
  files.has_torch = files.command.err.find("No module named 'torch'") == std::string::npos;
  std::istringstream words(files.command.out);
  for (std::string word; words >> word;) files.printed.push_back(std::strtof(word.c_str(), nullptr));
  return files;
}

}  // namespace testing
}  // namespace lockstep
