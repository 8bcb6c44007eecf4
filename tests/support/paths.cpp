#include "paths.h"

namespace lockstep {
namespace testing {

const char* bin_dir() { return LOCKSTEP_BUILD_BIN_DIR; }
const char* source_dir() { return LOCKSTEP_BUILD_SOURCE_DIR; }
const char* test_python() { return LOCKSTEP_BUILD_TEST_PYTHON; }
const char* prefix_path() { return LOCKSTEP_BUILD_PREFIX_PATH; }
const char* cxx_compiler() { return LOCKSTEP_BUILD_CXX_COMPILER; }

}  // namespace testing
}  // namespace lockstep
