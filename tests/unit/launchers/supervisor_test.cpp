#include <lockstep/launchers/supervisor.h>

#include <signal.h>

#include <chrono>
#include <map>
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

const std::map<std::string, std::string> kEnvironment = {{"PATH", "/usr/bin:/bin"}};

pid_t shell(Supervisor& supervisor, int rank, const std::string& script,
            const std::map<std::string, std::string>& environment = kEnvironment) {
  return supervisor.spawn(rank, "/bin/sh", {"sh", "-c", script}, environment);
}

std::vector<pid_t> pids_of(const Supervisor& supervisor) {
  std::vector<pid_t> pids;
  for (const auto& worker : supervisor.workers()) pids.push_back(worker.pid);
  return pids;
}

class launch_supervisor : public ::testing::Test {
 protected:
  void SetUp() override { become_subreaper(); }
};

TEST_F(launch_supervisor, AllExitZeroReturnsZero) {
  Supervisor supervisor(milliseconds(500));
  for (int rank = 0; rank < 3; ++rank) shell(supervisor, rank, "sleep 0.1");
  EXPECT_EQ(supervisor.wait(), 0);
  EXPECT_EQ(supervisor.running(), 0);
  EXPECT_FALSE(supervisor.first_failure());
  for (const auto& worker : supervisor.workers()) EXPECT_EQ(worker.exit_code, 0);
  EXPECT_TRUE(all_gone_within(pids_of(supervisor), milliseconds(1000)));
}

TEST_F(launch_supervisor, ReturnsTheFailingWorkersCodeAndTerminatesTheOthers) {
  Supervisor supervisor(milliseconds(2000));
  shell(supervisor, 0, "exec sleep 30");
  shell(supervisor, 1, "sleep 0.2; exit 7");
  shell(supervisor, 2, "exec sleep 30");
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(supervisor.wait(), 7);
  const std::string report = ::testing::internal::GetCapturedStderr();
  // sleep 30 dies on SIGTERM: no SIGKILL was needed (no timing assertion: CI machines are loaded).
  EXPECT_EQ(supervisor.workers()[0].exit_code, 128 + SIGTERM);
  EXPECT_EQ(supervisor.workers()[2].exit_code, 128 + SIGTERM);
  EXPECT_NE(report.find("worker local_rank=1 (pid " + std::to_string(supervisor.workers()[1].pid) +
                        ") exited with code 7; terminating 2 other worker(s)"),
            std::string::npos)
      << report;
  ASSERT_TRUE(supervisor.first_failure());
  EXPECT_EQ(supervisor.first_failure()->local_rank, 1);
  EXPECT_EQ(supervisor.workers()[0].exit_code, 128 + SIGTERM);
  EXPECT_EQ(supervisor.workers()[2].exit_code, 128 + SIGTERM);
  EXPECT_TRUE(all_gone_within(pids_of(supervisor), milliseconds(1000)));
}

TEST_F(launch_supervisor, DeathBySignalIs128PlusTheSignal) {
  Supervisor supervisor(milliseconds(500));
  shell(supervisor, 0, "kill -9 $$");
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(supervisor.wait(), 128 + SIGKILL);
  const std::string report = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(report.find("was killed by signal 9"), std::string::npos) << report;
}

TEST_F(launch_supervisor, SigkillAfterTheGracePeriodForWorkersIgnoringSigterm) {
  Supervisor supervisor(milliseconds(600));
  shell(supervisor, 0, "trap '' TERM; while true; do sleep 0.05; done");
  shell(supervisor, 1, "sleep 0.3; exit 1");
  const auto start = Clock::now();
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(supervisor.wait(), 1);
  const std::string report = ::testing::internal::GetCapturedStderr();
  const long elapsed = elapsed_ms(start);
  EXPECT_GE(elapsed, 900) << "the SIGTERM-ignoring worker must get the whole grace period";
  EXPECT_LT(elapsed, 20000) << "it loops forever: only SIGKILL ends it";
  EXPECT_NE(report.find("SIGKILL to 1 worker(s)"), std::string::npos) << report;
  EXPECT_EQ(supervisor.workers()[0].exit_code, 128 + SIGKILL);
  EXPECT_TRUE(all_gone_within(pids_of(supervisor), milliseconds(1000)));
}

TEST_F(launch_supervisor, WaitForTimesOutAndTerminateAllReapsEveryone) {
  Supervisor supervisor(milliseconds(500));
  shell(supervisor, 0, "exec sleep 30");
  shell(supervisor, 1, "exec sleep 30");
  EXPECT_FALSE(supervisor.wait_for(milliseconds(150)));
  EXPECT_EQ(supervisor.running(), 2);
  supervisor.terminate_all();
  EXPECT_EQ(supervisor.running(), 0);
  EXPECT_EQ(supervisor.workers()[0].exit_code, 128 + SIGTERM);
  EXPECT_EQ(supervisor.workers()[1].exit_code, 128 + SIGTERM);
  EXPECT_TRUE(all_gone_within(pids_of(supervisor), milliseconds(1000)));
}

TEST_F(launch_supervisor, DestructorLeavesNoWorkerBehind) {
  std::vector<pid_t> pids;
  {
    Supervisor supervisor(milliseconds(300));
    shell(supervisor, 0, "exec sleep 30");
    shell(supervisor, 1, "trap '' TERM; while true; do sleep 0.05; done");
    pids = pids_of(supervisor);
  }
  EXPECT_TRUE(all_gone_within(pids, milliseconds(100)));
}

TEST_F(launch_supervisor, SignalsReachWhatTheWorkersStarted) {
  TempDir dir;
  Supervisor supervisor(milliseconds(1000));
  // The shell does not exec sleep; it waits for it, so sleep is a grandchild of ours.
  shell(supervisor, 0, "sleep 30 & echo $! > " + dir.file("grandchild") + "; wait",
        kEnvironment);
  ASSERT_TRUE(wait_for_files({dir.file("grandchild")}, milliseconds(5000)));
  std::this_thread::sleep_for(milliseconds(50));
  const pid_t grandchild = read_pid(dir.file("grandchild"));
  ASSERT_GT(grandchild, 0);
  shell(supervisor, 1, "exit 4");
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(supervisor.wait(), 4);
  ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(all_gone_within({grandchild}, milliseconds(2000)));
  kill_all({grandchild});
}

TEST_F(launch_supervisor, EnvironmentIsExactlyTheOneGiven) {
  TempDir dir;
  Supervisor supervisor(milliseconds(500));
  supervisor.spawn(1, "/bin/sh", {"sh", "-c", "/usr/bin/env > " + dir.file("env")},
                   {{"ONLY", "this"}, {"RANK", "1"}});
  EXPECT_EQ(supervisor.wait(), 0);
  const auto vars = read_variables(dir.file("env"));
  EXPECT_EQ(vars.at("ONLY"), "this");
  EXPECT_EQ(vars.at("RANK"), "1");
  EXPECT_EQ(vars.count("HOME"), 0u);
}

TEST_F(launch_supervisor, ExecFailureIsCode127) {
  Supervisor supervisor(milliseconds(500));
  ::testing::internal::CaptureStderr();
  supervisor.spawn(0, "/nonexistent/program", {"program"}, kEnvironment);
  EXPECT_EQ(supervisor.wait(), 127);
  const std::string report = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(report.find("cannot execute /nonexistent/program"), std::string::npos) << report;
}

TEST_F(launch_supervisor, InterruptIsForwardedAndGivesItsCode) {
  TempDir dir;
  Supervisor supervisor(milliseconds(2000));
  for (int rank = 0; rank < 2; ++rank) {
    shell(supervisor, rank,
          "trap 'echo got > " + dir.file("term." + std::to_string(rank)) +
              "; exit 0' TERM; touch " + dir.file("ready." + std::to_string(rank)) +
              "; while true; do sleep 0.05; done");
  }
  ASSERT_TRUE(wait_for_files({dir.file("ready.0"), dir.file("ready.1")}, milliseconds(5000)));
  std::thread interrupter([&] {
    std::this_thread::sleep_for(milliseconds(100));
    supervisor.interrupt(SIGTERM);
  });
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(supervisor.wait(), 128 + SIGTERM);
  interrupter.join();
  const std::string report = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(report.find("forwarding it to 2 worker(s)"), std::string::npos) << report;
  EXPECT_TRUE(exists(dir.file("term.0")));
  EXPECT_TRUE(exists(dir.file("term.1")));
  EXPECT_FALSE(supervisor.first_failure()) << "exits after a forwarded signal are not failures";
}

// Every rank agreed to stop with 130 (a Trainer after Ctrl-C): workers exiting so are not failures.
TEST_F(launch_supervisor, AnExpectedExitCodeIsNotAFailure) {
  Supervisor supervisor(milliseconds(2000));
  shell(supervisor, 0, "exit 130");
  shell(supervisor, 1, "sleep 0.2; exit 130");
  supervisor.expect_exit_code(130);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(supervisor.wait(), 0);
  const std::string report = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(report, "");
  EXPECT_FALSE(supervisor.first_failure());
  EXPECT_EQ(supervisor.workers()[1].exit_code, 130);
}

// Two Ctrl-Cs before the next poll are a second one: forwarded, then SIGKILL without the grace
// period (the workers ignore SIGINT; without the kill the test would wait the 60 s grace).
TEST_F(launch_supervisor, TwoInterruptsAtOnceKillTheWorkers) {
  TempDir dir;
  Supervisor supervisor(milliseconds(60000));
  for (int rank = 0; rank < 2; ++rank) {
    shell(supervisor, rank, "trap '' INT; touch " + dir.file("ready." + std::to_string(rank)) + "; exec sleep 30");
  }
  ASSERT_TRUE(wait_for_files({dir.file("ready.0"), dir.file("ready.1")}, milliseconds(5000)));
  supervisor.interrupt(SIGINT);
  supervisor.interrupt(SIGINT);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(supervisor.wait(), 128 + SIGINT);
  const std::string report = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(report.find("forwarding it to 2 worker(s)"), std::string::npos) << report;
  EXPECT_NE(report.find("again; killing 2 worker(s)"), std::string::npos) << report;
  EXPECT_EQ(supervisor.workers()[0].exit_code, 128 + SIGKILL);
  EXPECT_EQ(supervisor.workers()[1].exit_code, 128 + SIGKILL);
}

TEST_F(launch_supervisor, ParentDeathKillsTheWorker) {
  // A child process owns the Supervisor; SIGKILL it and its worker must die (PR_SET_PDEATHSIG).
  TempDir dir;
  const pid_t owner = ::fork();
  if (owner == 0) {
    Supervisor supervisor(milliseconds(500));
    shell(supervisor, 0, "echo $$ > " + dir.file("pid.partial") + "; mv " + dir.file("pid.partial") +
                             " " + dir.file("pid") + "; exec sleep 30");
    supervisor.wait();
    ::_exit(0);
  }
  ASSERT_TRUE(wait_for_files({dir.file("pid")}, milliseconds(5000)));
  const pid_t worker = read_pid(dir.file("pid"));
  ::kill(owner, SIGKILL);
  EXPECT_EQ(wait_exit(owner, milliseconds(2000)), 128 + SIGKILL);
  EXPECT_TRUE(all_gone_within({worker}, milliseconds(2000)));
  kill_all({worker});
}

}  // namespace
}  // namespace launchers
}  // namespace lockstep
