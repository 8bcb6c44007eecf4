// test_fork_client and the fork server (tests/support/fork_server.h), through core_tests' probe
// case (tests/unit/core/fork_server_probe_test.cpp): a case runs with the client's environment,
// folder and streams, as a fork of one server, ends as its client sees it, and ends with it.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <regex>
#include <thread>

#include "../support/command.h"
#include "../support/paths.h"

namespace lockstep {
namespace {

const std::string tests_dir = std::filesystem::path(LOCKSTEP_BIN_DIR).parent_path().string() + "/tests";

std::vector<std::string> probe_case() {
  return {tests_dir + "/test_fork_client", tests_dir + "/core_tests",
          "--gtest_filter=ForkServerProbe.SeesTheClientsEnvironmentNotTheServers"};
}

std::map<std::string, std::string> asking(const std::string& probe) {
  return {{"PATH", "/usr/bin:/bin"}, {"LOCKSTEP_FORK_PROBE", probe}};
}

// The number after `key=` in a probe's output, or -1.
long seen(const std::string& out, const std::string& key) {
  std::smatch match;
  if (!std::regex_search(out, match, std::regex(key + "=(\\d+)"))) return -1;
  return std::stol(match[1]);
}

TEST(ForkServer, ACaseSeesTheClientsEnvironmentFolderAndArgumentsAsAForkOfOneServer) {
  const std::string probe = "seen" + std::to_string(::getpid());
  const auto first = testing::run_command(probe_case(), asking(probe));
  const auto second = testing::run_command(probe_case(), asking(probe));
  for (const auto* run : {&first, &second}) {
    ASSERT_EQ(run->exit_code, 0) << run->out << run->err;
    EXPECT_NE(run->out.find("probe=" + probe + " folder=" + std::filesystem::current_path().string() + " "),
              std::string::npos)
        << run->out;
    EXPECT_EQ(seen(run->out, "arguments"), 2) << "the program and its filter: " << run->out;
  }
  EXPECT_NE(seen(first.out, "pid"), seen(second.out, "pid")) << "each case is a process of its own";
  EXPECT_NE(seen(first.out, "parent"), ::getpid()) << "a fork of the server, not the client's program run directly";
  EXPECT_EQ(seen(first.out, "parent"), seen(second.out, "parent")) << "both are forks of one server:\n"
                                                                   << first.out << second.out;
}

TEST(ForkServer, TheClientEndsAsItsCaseEnded) {
  const auto failed = testing::run_command(probe_case(), asking("fail"));
  EXPECT_EQ(failed.exit_code, 1) << failed.out << failed.err;
  EXPECT_NE(failed.out.find("asked to fail"), std::string::npos) << failed.out;
  const auto aborted = testing::run_command(probe_case(), asking("abort"));
  EXPECT_EQ(aborted.exit_code, 128 + SIGABRT) << aborted.out << aborted.err;
}

TEST(ForkServer, AKilledClientTakesItsCaseWithIt) {
  const auto client = testing::start_command(probe_case(), asking("sleep"));
  ASSERT_GT(client.pid, 0);
  long pid = -1;
  for (int i = 0; i < 600 && pid < 0; ++i) {  // a server starts in about a second
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    pid = seen(testing::slurp(client.dir + "/out"), "pid");
  }
  ASSERT_GT(pid, 0) << "the case never said it started";
  ::kill(-client.pid, SIGKILL);  // as CTest does past a test's timeout
  testing::finish_command(client, std::chrono::seconds(10));
  bool gone = false;
  for (int i = 0; i < 100 && !gone; ++i) {
    gone = ::kill(static_cast<pid_t>(pid), 0) != 0;
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(gone) << "case " << pid << " still runs after its client was killed";
}

}  // namespace
}  // namespace lockstep
