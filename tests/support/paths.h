#pragma once
// Where the build, the source and the parity Python are, for tests that run programs or read
// files. Only paths.cpp is compiled with the build's absolute paths, so that every other test file
// compiles to the same object wherever the checkout is (ccache hits in a fresh clone, as in CI).

namespace lockstep {
namespace testing {

const char* bin_dir();       // the build's bin/
const char* source_dir();    // the checkout
const char* test_python();   // a Python whose torch is this build's LibTorch
const char* prefix_path();   // where this build found Torch (CMAKE_PREFIX_PATH)
const char* cxx_compiler();  // the compiler of this build (CMAKE_CXX_COMPILER)

}  // namespace testing
}  // namespace lockstep

#define LOCKSTEP_BIN_DIR ::lockstep::testing::bin_dir()
#define LOCKSTEP_SOURCE_DIR ::lockstep::testing::source_dir()
#define LOCKSTEP_TEST_PYTHON ::lockstep::testing::test_python()
#define LOCKSTEP_PREFIX_PATH ::lockstep::testing::prefix_path()
#define LOCKSTEP_CXX_COMPILER ::lockstep::testing::cxx_compiler()
