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

// `launch_rank_program DIR KIND NPROC ARGS...`: a program that launches itself with LocalLauncher,
// KIND "subprocess" (StartMethod::reexec) or "fork".
Process run_program(const TempDir& dir, const std::string& kind, int nproc, const std::vector<std::string>& args) {
  std::vector<std::string> argv = {program("launch_rank_program"), dir.path(), kind, std::to_string(nproc)};
  argv.insert(argv.end(), args.begin(), args.end());
  return start(argv, dir.file("stderr"), {{"TMPDIR", dir.path()}});
}

std::vector<std::string> rank_files(const TempDir& dir, int nproc) {
  std::vector<std::string> files;
  for (int rank = 0; rank < nproc; ++rank) files.push_back(dir.file("rank." + std::to_string(rank)));
  return files;
}

// The pids the ranks recorded (a rank terminated before recording it has none).
std::vector<pid_t> rank_pids(const TempDir& dir, int nproc) {
  std::vector<pid_t> pids;
  for (const auto& file : rank_files(dir, nproc)) {
    const auto vars = read_variables(file);
    if (vars.count("PID") > 0) pids.push_back(static_cast<pid_t>(std::stol(vars.at("PID"))));
  }
  return pids;
}

class subprocess_launcher : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { become_subreaper(); }
};

TEST_P(subprocess_launcher, ReexecutesTheProgramForEveryRank) {
  const int nproc = GetParam();
  TempDir dir;
  const auto process = run_program(dir, "subprocess", nproc, {"grace=500", "--marker=42"});
  ASSERT_EQ(wait_exit(process.pid, milliseconds(15000)), 0) << process.stderr_text();
  std::set<std::string> ports, pids;
  for (int rank = 0; rank < nproc; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const auto vars = read_variables(dir.file("rank." + std::to_string(rank)));
    ASSERT_FALSE(vars.empty());
    EXPECT_EQ(vars.at("RANK"), std::to_string(rank));
    EXPECT_EQ(vars.at("LOCAL_RANK"), std::to_string(rank));
    EXPECT_EQ(vars.at("WORLD_SIZE"), std::to_string(nproc));
    EXPECT_EQ(vars.at("MASTER_ADDR"), "127.0.0.1");
    EXPECT_EQ(vars.at("LAUNCHER"), "subprocess");
    EXPECT_NE(vars.at("ARGS").find(" subprocess " + std::to_string(nproc) + " grace=500 --marker=42"),
              std::string::npos)
        << "the children get rank 0's argv: " << vars.at("ARGS");
    if (rank == 0) {
      EXPECT_EQ(vars.at("PID"), std::to_string(process.pid));
      // Rank 0's launch() hands over its placement, the values of the variables it exported.
      EXPECT_EQ(vars.at("PLACEMENT"), "0 0 " + std::to_string(nproc) + " 127.0.0.1 " + vars.at("MASTER_PORT"));
    } else {
      EXPECT_EQ(vars.at("PPID"), std::to_string(process.pid)) << "a child of rank 0";
      EXPECT_EQ(vars.at("PLACEMENT"), "none") << "a re-executed worker reads its environment";
    }
    ports.insert(vars.at("MASTER_PORT"));
    pids.insert(vars.at("PID"));
  }
  EXPECT_EQ(ports.size(), 1u);
  EXPECT_NE(*ports.begin(), "0");
  EXPECT_EQ(pids.size(), static_cast<std::size_t>(nproc));
  EXPECT_TRUE(all_gone_within(rank_pids(dir, nproc), milliseconds(1000)));
}

INSTANTIATE_TEST_SUITE_P(launch, subprocess_launcher, ::testing::Values(1, 2, 4));

class subprocess_launcher_job : public ::testing::Test {
 protected:
  void SetUp() override { become_subreaper(); }
};

TEST_F(subprocess_launcher_job, FailedChildEndsTheWholeProcessWithItsCode) {
  TempDir dir;
  const auto started = Clock::now();
  // Rank 0 would sleep 20 s; rank 1 fails at once.
  const auto process = run_program(dir, "subprocess", 3, {"grace=1000", "fail=1:3", "sleep=0:20000", "sleep=2:20000"});
  EXPECT_EQ(wait_exit(process.pid, milliseconds(10000)), 3) << process.stderr_text();
  EXPECT_LT(elapsed_ms(started), 12000) << "rank 0 sleeps 20 s: it was not ended";
  const std::string report = process.stderr_text();
  EXPECT_NE(report.find("worker local_rank=1"), std::string::npos) << report;
  EXPECT_NE(report.find("exited with code 3"), std::string::npos) << report;
  EXPECT_NE(report.find("ending local rank 0"), std::string::npos) << report;
  const auto pids = rank_pids(dir, 3);
  EXPECT_TRUE(all_gone_within(pids, milliseconds(1000)));
  kill_all(pids);
}

TEST_F(subprocess_launcher_job, RankZeroWaitsAtExitForSlowerChildren) {
  TempDir dir;
  const auto process = run_program(dir, "subprocess", 2, {"sleep=1:700", "exit_timeout=10000"});
  EXPECT_EQ(wait_exit(process.pid, milliseconds(10000)), 0) << process.stderr_text();
  EXPECT_TRUE(exists(dir.file("done.1"))) << "rank 1 finished after rank 0 returned from main";
  EXPECT_TRUE(all_gone_within(rank_pids(dir, 2), milliseconds(1000)));
}

TEST_F(subprocess_launcher_job, ChildrenStillRunningAfterTheExitTimeoutAreTerminated) {
  TempDir dir;
  const auto started = Clock::now();
  const auto process = run_program(dir, "subprocess", 2, {"sleep=1:30000", "exit_timeout=300", "grace=500"});
  const auto code = wait_exit(process.pid, milliseconds(10000));
  EXPECT_EQ(code, 128 + SIGTERM) << process.stderr_text();
  EXPECT_LT(elapsed_ms(started), 15000) << "rank 1 sleeps 30 s: it was not terminated";
  EXPECT_NE(process.stderr_text().find("still ran 300 ms later; terminating them"),
            std::string::npos)
      << process.stderr_text();
  EXPECT_FALSE(exists(dir.file("done.1")));
  const auto pids = rank_pids(dir, 2);
  EXPECT_TRUE(all_gone_within(pids, milliseconds(1000)));
  kill_all(pids);
}

TEST_F(subprocess_launcher_job, ChildrenDieWhenRankZeroIsKilled) {
  TempDir dir;
  const auto process = run_program(dir, "subprocess", 3, {"sleep=0:30000", "sleep=1:30000", "sleep=2:30000"});
  ASSERT_TRUE(wait_for_files(rank_files(dir, 3), milliseconds(10000))) << process.stderr_text();
  const auto pids = rank_pids(dir, 3);
  ::kill(process.pid, SIGKILL);
  EXPECT_EQ(wait_exit(process.pid, milliseconds(2000)), 128 + SIGKILL);
  EXPECT_TRUE(all_gone_within(pids, milliseconds(2000)));
  kill_all(pids);
}

TEST_F(subprocess_launcher_job, LaunchInAWorkerStartsNothing) {
  // Under torchrun (or in our own children) the variables are set: launch() must not multiply.
  TempDir dir;
  const auto process = start({program("launch_rank_program"), dir.path(), "subprocess", "4"},
                             dir.file("stderr"),
                             {{"RANK", "5"}, {"GROUP_RANK", "1"}, {"LOCAL_RANK", "1"},
                              {"LOCAL_WORLD_SIZE", "4"}, {"WORLD_SIZE", "8"}});
  EXPECT_EQ(wait_exit(process.pid, milliseconds(10000)), 0) << process.stderr_text();
  EXPECT_TRUE(exists(dir.file("rank.5")));
  EXPECT_FALSE(exists(dir.file("rank.0")));
  EXPECT_EQ(read_variables(dir.file("rank.5")).at("WORLD_SIZE"), "8");
}

TEST(subprocess_launcher_name, IsSubprocess) {
  EXPECT_EQ(LocalLauncher().name(), "subprocess");
}

// Rank 0 scrubs a secret from its argv in place before launching: the workers are still started
// with the command line the program was started with, not the edited memory.
TEST_F(subprocess_launcher_job, WorkersGetTheArgvTheProgramStartedWith) {
  TempDir dir;
  const auto process = run_program(dir, "subprocess", 2, {"grace=500", "scrub", "--token=secret"});
  ASSERT_EQ(wait_exit(process.pid, milliseconds(15000)), 0) << process.stderr_text();
  const auto rank0 = read_variables(dir.file("rank.0"));
  const auto rank1 = read_variables(dir.file("rank.1"));
  ASSERT_FALSE(rank1.empty()) << process.stderr_text();
  EXPECT_NE(rank0.at("ARGS").find("scrub xxxxxxxxxxxxxx"), std::string::npos) << "rank 0 scrubbed: " << rank0.at("ARGS");
  EXPECT_NE(rank1.at("START_ARGS").find("scrub --token=secret"), std::string::npos) << rank1.at("START_ARGS");
}

// StartMethod::fork.

class fork_launcher : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { become_subreaper(); }
};

TEST_P(fork_launcher, ForksEveryRankBeforeAnyThreadExists) {
  const int nproc = GetParam();
  TempDir dir;
  const auto process = run_program(dir, "fork", nproc, {"grace=500"});
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
  const auto process = run_program(dir, "fork", 2, {"grace=1000", "fail=1:4", "sleep=0:20000"});
  EXPECT_EQ(wait_exit(process.pid, milliseconds(10000)), 4) << process.stderr_text();
  const auto pids = rank_pids(dir, 2);
  EXPECT_TRUE(all_gone_within(pids, milliseconds(1000)));
  kill_all(pids);
}

TEST_F(fork_launcher_job, RankZeroWaitsAtExitForForkedWorkers) {
  TempDir dir;
  const auto process = run_program(dir, "fork", 2, {"sleep=1:500", "exit_timeout=10000"});
  EXPECT_EQ(wait_exit(process.pid, milliseconds(10000)), 0) << process.stderr_text();
  EXPECT_TRUE(exists(dir.file("done.1")));
}

TEST_F(fork_launcher_job, RefusesOnceAThreadExistsInAProgram) {
  TempDir dir;
  const auto process = run_program(dir, "fork", 2, {"thread_first"});
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
