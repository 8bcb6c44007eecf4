// The main() of every test program: Google Test's, or a fork server when test_fork_client started
// this process as one (fork_server.h).
#include <gtest/gtest.h>

#include <cstdlib>

#include "fork_server.h"

int main(int argc, char** argv) {
  if (const char* name = std::getenv(lockstep::testing::kForkServerVariable)) {
    return lockstep::testing::serve_forks(name);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
