// The case that ForkServer.* (tests/tools/fork_server_test.cpp) runs through test_fork_client:
// core_tests' cases are forks of a loaded server (tests/support/fork_server.h).
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <thread>

namespace lockstep {
namespace {

TEST(ForkServerProbe, SeesTheClientsEnvironmentNotTheServers) {
  EXPECT_EQ(std::getenv("LOCKSTEP_TEST_FORK_SERVER"), nullptr);
  // Asked by ForkServer.*: say what this case sees, then end as asked.
  const char* probe = std::getenv("LOCKSTEP_FORK_PROBE");
  if (probe == nullptr) return;
  std::cout << "probe=" << probe << " folder=" << std::filesystem::current_path().string() << " pid=" << ::getpid()
            << " parent=" << ::getppid() << " arguments=" << ::testing::internal::GetArgvs().size() << std::endl;
  const std::string asked = probe;
  if (asked == "fail") ADD_FAILURE() << "asked to fail";
  if (asked == "abort") std::abort();
  if (asked == "sleep") std::this_thread::sleep_for(std::chrono::seconds(60));
}

}  // namespace
}  // namespace lockstep
