// The main() of every test program: Google Test's, or a fork server when test_fork_client started
// this process as one (fork_server.h).
#include <gtest/gtest.h>

#include "fork_server.h"

namespace {

int run_tests(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

}  // namespace

int main(int argc, char** argv) { return lockstep::testing::program_main(argc, argv, run_tests); }
