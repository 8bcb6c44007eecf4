// Faults a real job meets, on real processes (tests/programs/trainer_program, self-launched):
// a rank killed with SIGKILL at some moment of a 2- or 4-rank job, and the whole job killed while
// it writes checkpoints. The job must end, say which rank, and lose no checkpoint.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include <lockstep/checkpoint/checkpoint_io.h>

#include "../../support/command.h"
#include "../../support/paths.h"
#include "../../support/temp_dir.h"

namespace lockstep {
namespace {

using namespace std::chrono_literals;

const std::string program = std::string(LOCKSTEP_BIN_DIR) + "/../tests/trainer_program";

std::vector<pid_t> children_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) + "/children");
  std::vector<pid_t> children;
  for (pid_t child; in >> child;) children.push_back(child);
  return children;
}

// The self-launched worker with LOCAL_RANK=`rank` (a child of rank 0), or 0 while there is none.
pid_t worker_with_rank(pid_t rank0, int rank) {
  for (pid_t child : children_of(rank0)) {
    std::ifstream in("/proc/" + std::to_string(child) + "/environ");
    std::string environ((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (environ.find(std::string(1, '\0') + "LOCAL_RANK=" + std::to_string(rank) + '\0') != std::string::npos) return child;
  }
  return 0;
}

bool alive(pid_t pid) { return ::kill(pid, 0) == 0; }

// Whether every one of `pids` is gone by `deadline` (waits until then at most).
bool all_gone(const std::vector<pid_t>& pids, std::chrono::steady_clock::time_point deadline) {
  while (std::any_of(pids.begin(), pids.end(), alive)) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

std::map<std::string, std::string> environment() {
  return {{"PATH", "/usr/bin:/bin"}, {"OMP_NUM_THREADS", "1"}, {"LOCKSTEP_NO_BLAS_WARNING", "1"}};
}

class KilledRank : public ::testing::TestWithParam<int> {};

// SIGKILL to rank 1 while the ranks start (rendezvous), at a random moment of training, and while
// checkpoints are written (one every step): with a 20 s collective timeout every process is gone
// within 30 s, the exit code is not 0, and the message names rank 1.
TEST_P(KilledRank, TheJobEndsNamingTheRankWithinThirtySeconds) {
  const int ranks = GetParam();
  std::mt19937 random(std::random_device{}());
  for (const std::string moment : {"rendezvous", "training", "checkpointing"}) {
    testing::TempDir dir("lockstep_killed_rank");
    std::vector<std::string> argv{program, "--out", dir.path(), "--default-root-dir", dir.path() + "/runs",
                                  "--timeout", "20", "--devices", std::to_string(ranks), "--strategy", "ddp",
                                  "--max-epochs", "100000"};
    if (moment == "checkpointing") argv.insert(argv.end(), {"--checkpoint-every-n-steps", "1"});
    const auto job = testing::start_command(argv, environment());
    ASSERT_GT(job.pid, 0);
    pid_t victim = 0;
    for (int i = 0; i < 3000 && victim == 0; ++i) {
      victim = worker_with_rank(job.pid, 1);
      if (victim == 0) std::this_thread::sleep_for(1ms);
    }
    ASSERT_GT(victim, 0) << moment << ": rank 1 never started";
    // Training: after the ranks met (a run folder exists), then some random milliseconds.
    if (moment != "rendezvous") {
      for (int i = 0; i < 3000 && !std::filesystem::exists(dir.path() + "/runs/lockstep_logs"); ++i) {
        std::this_thread::sleep_for(10ms);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200 + random() % 800));
    }
    const std::vector<pid_t> everyone = [&] {
      auto all = children_of(job.pid);
      all.push_back(job.pid);
      return all;
    }();
    const auto killed = std::chrono::steady_clock::now();
    ::kill(victim, SIGKILL);
    const auto result = testing::finish_command(job, 60s);
    const bool any_alive = !all_gone(everyone, killed + 60s);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
    std::cerr << "[ measured ] " << ranks << " ranks, rank 1 killed at " << moment << ": every process gone after "
              << seconds << " s\n";
    EXPECT_FALSE(any_alive) << moment;
    EXPECT_LT(seconds, 30.0) << moment << ": " << result.err;
    EXPECT_NE(result.exit_code, 0) << moment << ": " << result.err;
    EXPECT_NE(result.err.find("local_rank=1"), std::string::npos) << moment << ": " << result.err;
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, KilledRank, ::testing::Values(2, 4),
                         [](const ::testing::TestParamInfo<int>& info) { return "ranks" + std::to_string(info.param); });

// A frozen rank (SIGSTOP; a host that vanished without closing its connections looks the same to
// its peers) ends the job within 30 s, naming it, with the collective timeout left at 1800 s:
// rank 1 of a self-launched job with the default bound (15 s), and rank 0 under `lockstep launch`
// (whose launcher is apart) with a bound of 5 s.
TEST(FrozenRank, TheJobEndsNamingItWithinTheLivenessTimeout) {
  for (const bool launch : {false, true}) {
    testing::TempDir dir("lockstep_frozen_rank");
    std::vector<std::string> argv;
    if (launch) argv = {std::string(LOCKSTEP_BIN_DIR) + "/lockstep", "launch", "--nproc-per-node", "2", "--"};
    argv.insert(argv.end(), {program, "--out", dir.path(), "--default-root-dir", dir.path() + "/runs",
                             "--strategy", "ddp", "--max-epochs", "100000"});
    if (launch) {
      argv.insert(argv.end(), {"--liveness-timeout", "5"});
    } else {
      argv.insert(argv.end(), {"--devices", "2"});
    }
    const std::string bound = launch ? "5" : "15";
    const int frozen = launch ? 0 : 1;
    const auto job = testing::start_command(argv, environment());
    ASSERT_GT(job.pid, 0);
    for (int i = 0; i < 3000 && !std::filesystem::exists(dir.path() + "/runs/lockstep_logs"); ++i) {
      std::this_thread::sleep_for(10ms);
    }
    std::this_thread::sleep_for(500ms);
    const pid_t victim = worker_with_rank(job.pid, frozen);
    ASSERT_GT(victim, 0) << "no worker with local rank " << frozen;
    auto everyone = children_of(job.pid);
    everyone.push_back(job.pid);
    const auto stopped = std::chrono::steady_clock::now();
    ::kill(victim, SIGSTOP);
    const auto result = testing::finish_command(job, 60s);
    const bool any_alive = !all_gone(everyone, stopped + 60s);
    if (any_alive) ::kill(victim, SIGKILL);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - stopped).count();
    std::cerr << "[ measured ] rank " << frozen << (launch ? " under lockstep launch" : " self-launched")
              << " frozen: every process gone after " << seconds << " s\n";
    EXPECT_FALSE(any_alive);
    EXPECT_LT(seconds, 30.0) << result.err;
    EXPECT_NE(result.exit_code, 0) << result.err;
    EXPECT_NE(result.err.find("rank " + std::to_string(frozen) + " stopped answering: no heartbeat for " + bound + " s"),
              std::string::npos) << result.err;
  }
}

// A rank that is only slow (a step three times the liveness timeout) beats all along: the job
// finishes.
TEST(FrozenRank, ASlowRankIsNotLost) {
  testing::TempDir dir("lockstep_slow_rank");
  const auto result = testing::run_command(
      {program, "--out", dir.path(), "--default-root-dir", dir.path() + "/runs", "--liveness-timeout", "3",
       "--devices", "2", "--strategy", "ddp", "--max-epochs", "1", "--pause-ms", "9000", "--pause-on-rank", "1"},
      environment(), 120s);
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(result.err.find("stopped answering"), std::string::npos) << result.err;
  EXPECT_TRUE(std::filesystem::exists(dir.path() + "/paused.1"));
  EXPECT_TRUE(std::filesystem::exists(dir.path() + "/done.0"));
  EXPECT_TRUE(std::filesystem::exists(dir.path() + "/done.1"));
}

// SIGKILL to the whole job at 20 random moments while it saves a checkpoint every step: every
// *.ckpt that exists afterwards loads, last.ckpt included. One process: only rank 0 writes
// checkpoints, and the same writer writes them under DDP; a second rank only cost start-up time.
TEST(KilledJob, EveryCheckpointLeftBehindLoads) {
  std::mt19937 random(std::random_device{}());
  int checkpoints_seen = 0;
  for (int round = 0; round < 20; ++round) {
    testing::TempDir dir("lockstep_killed_job");
    const auto job = testing::start_command(
        {program, "--out", dir.path(), "--default-root-dir", dir.path() + "/runs", "--timeout", "20", "--devices",
         "1", "--max-epochs", "100000", "--checkpoint-every-n-steps", "1"},
        environment());
    ASSERT_GT(job.pid, 0);
    const std::string checkpoints = dir.path() + "/runs/lockstep_logs/version_0/checkpoints";
    for (int i = 0; i < 3000 && !std::filesystem::exists(checkpoints); ++i) std::this_thread::sleep_for(10ms);
    std::this_thread::sleep_for(std::chrono::milliseconds(random() % 500));
    ::kill(-job.pid, SIGKILL);
    const auto result = testing::finish_command(job, 60s);
    EXPECT_EQ(result.exit_code, 128 + SIGKILL);
    std::error_code ignored;
    for (const auto& entry : std::filesystem::directory_iterator(checkpoints, ignored)) {
      const std::string path = entry.path().string();
      if (entry.path().extension() != ".ckpt") continue;
      ++checkpoints_seen;
      try {
        checkpoint::CheckpointIO().load(path);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "round " << round << ": " << path << " does not load: " << e.what();
      }
    }
  }
  EXPECT_GT(checkpoints_seen, 20) << "the job was killed before it wrote anything";
}

}  // namespace
}  // namespace lockstep
