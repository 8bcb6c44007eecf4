#include <lockstep/launchers/local_launcher.h>
#include <lockstep/launchers/launch_error.h>

#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "process_support.h"

namespace lockstep {
namespace launchers {
namespace {

using namespace lockstep::testing;
using std::chrono::milliseconds;

Process run_program(const TempDir& dir, int nproc, const std::vector<std::string>& args) {
  std::vector<std::string> argv = {program("launch_rank_program"), dir.path(), "fork",
                                   std::to_string(nproc)};
  argv.insert(argv.end(), args.begin(), args.end());
  return start(argv, dir.file("stderr"), {{"TMPDIR", dir.path()}});
}

std::vector<pid_t> rank_pids(const TempDir& dir, int nproc) {
  std::vector<pid_t> pids;
  for (int rank = 0; rank < nproc; ++rank) {
    const auto vars = read_variables(dir.file("rank." + std::to_string(rank)));
    if (vars.count("PID") > 0) pids.push_back(static_cast<pid_t>(std::stol(vars.at("PID"))));
  }
  return pids;
}

class fork_launcher : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { become_subreaper(); }
};

TEST_P(fork_launcher, ForksEveryRankBeforeAnyThreadExists) {
  const int nproc = GetParam();
  TempDir dir;
  const auto process = run_program(dir, nproc, {"grace=500"});
  ASSERT_EQ(wait_exit(process.pid, milliseconds(15000)), 0) << process.stderr_text();
  EXPECT_FALSE(exists(dir.file("error"))) << read_text(dir.file("error"));
  std::set<std::string> ports;
  for (int rank = 0; rank < nproc; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const auto vars = read_variables(dir.file("rank." + std::to_string(rank)));
    ASSERT_FALSE(vars.empty());
    EXPECT_EQ(vars.at("RANK"), std::to_string(rank));
    EXPECT_EQ(vars.at("LOCAL_RANK"), std::to_string(rank));
    EXPECT_EQ(vars.at("WORLD_SIZE"), std::to_string(nproc));
    EXPECT_EQ(vars.at("LAUNCHER"), "fork");
    // Every fork continues from launch(), which hands over its placement.
    EXPECT_EQ(vars.at("PLACEMENT"), std::to_string(rank) + " " + std::to_string(rank) + " " + std::to_string(nproc) +
                                        " 127.0.0.1 " + vars.at("MASTER_PORT"));
    if (rank == 0) {
      EXPECT_EQ(vars.at("PID"), std::to_string(process.pid));
    } else {
      EXPECT_EQ(vars.at("PPID"), std::to_string(process.pid));
    }
    ports.insert(vars.at("MASTER_PORT"));
  }
  EXPECT_EQ(ports.size(), 1u);
  EXPECT_TRUE(all_gone_within(rank_pids(dir, nproc), milliseconds(1000)));
}

INSTANTIATE_TEST_SUITE_P(launch, fork_launcher, ::testing::Values(1, 2, 4));

class fork_launcher_job : public ::testing::Test {
 protected:
  void SetUp() override { become_subreaper(); }
};

TEST_F(fork_launcher_job, FailedForkedWorkerEndsTheJobWithItsCode) {
  TempDir dir;
  const auto process = run_program(dir, 2, {"grace=1000", "fail=1:4", "sleep=0:20000"});
  EXPECT_EQ(wait_exit(process.pid, milliseconds(10000)), 4) << process.stderr_text();
  const auto pids = rank_pids(dir, 2);
  EXPECT_TRUE(all_gone_within(pids, milliseconds(1000)));
  kill_all(pids);
}

TEST_F(fork_launcher_job, RankZeroWaitsAtExitForForkedWorkers) {
  TempDir dir;
  const auto process = run_program(dir, 2, {"sleep=1:500", "exit_timeout=10000"});
  EXPECT_EQ(wait_exit(process.pid, milliseconds(10000)), 0) << process.stderr_text();
  EXPECT_TRUE(exists(dir.file("done.1")));
}

TEST_F(fork_launcher_job, RefusesOnceAThreadExistsInAProgram) {
  TempDir dir;
  const auto process = run_program(dir, 2, {"thread_first"});
  EXPECT_EQ(wait_exit(process.pid, milliseconds(10000)), 2) << process.stderr_text();
  const std::string message = read_text(dir.file("error"));
  EXPECT_NE(message.find("ddp_fork must start before any threads exist (found 2 threads"),
            std::string::npos)
      << message;
  EXPECT_FALSE(exists(dir.file("rank.1")));
}

TEST(fork_launcher_refusal, RefusesInThisProcessOnceAThreadRuns) {
  std::mutex mutex;
  std::condition_variable released;
  bool release = false;
  std::thread waiting([&] {
    std::unique_lock<std::mutex> lock(mutex);
    released.wait(lock, [&] { return release; });
  });
  std::string message;
  try {
    LocalLauncher(LaunchOptions().nproc_per_node(2), StartMethod::fork).launch();
  } catch (const LaunchError& error) {
    message = error.what();
  }
  {
    std::lock_guard<std::mutex> lock(mutex);
    release = true;
  }
  released.notify_all();
  waiting.join();
  EXPECT_NE(message.find("ddp_fork must start before any threads exist"), std::string::npos)
      << message;
  EXPECT_NE(message.find("use --strategy ddp"), std::string::npos) << message;
  int status = 0;
  EXPECT_EQ(::waitpid(-1, &status, WNOHANG), -1) << "no worker may have been forked";
}

TEST(fork_launcher_name, IsFork) { EXPECT_EQ(LocalLauncher(LaunchOptions(), StartMethod::fork).name(), "fork"); }

}  // namespace
}  // namespace launchers
}  // namespace lockstep
