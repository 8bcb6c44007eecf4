// Ctrl-C to a 2-rank Trainer job, as a terminal sends it: SIGINT to the process group of the
// command typed (the self-launched program, which is rank 0, or `lockstep launch`); the workers
// sit in a group of their own. tests/programs/trainer_program pauses every rank after its first
// batch and says so in a file: the signal comes then, mid-epoch.
#include <signal.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <regex>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <lockstep/checkpoint/checkpoint_io.h>

#include "../../support/command.h"
#include "../../support/paths.h"
#include "../../support/temp_dir.h"
#include "../../support/written_parameters.h"

namespace lockstep {
namespace trainer_interrupt_test {

using testing::CommandResult;
using testing::StartedCommand;

// Whether `pid` still runs (not gone, not a zombie).
bool alive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const auto end = line.rfind(')');
  return end != std::string::npos && end + 2 < line.size() && line[end + 2] != 'Z';
}

// Whether a SIGINT sent to `pid` waits to be delivered (two would merge into one).
bool sigint_pending(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("SigPnd:", 0) != 0 && line.rfind("ShdPnd:", 0) != 0) continue;
    if (std::stoull(line.substr(7), nullptr, 16) & (1ull << (SIGINT - 1))) return true;
  }
  return false;
}

size_t count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (auto at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

class TrainerInterrupt : public ::testing::Test {
 protected:
  // 64 examples, 4 a batch on each of 2 ranks: 8 steps an epoch.
  std::vector<std::string> flags(const std::string& strategy, std::vector<std::string> more = {}) const {
    std::vector<std::string> all{"--devices", "2", "--strategy", strategy, "--adam", "--max-epochs", "2", "--batch-size", "4"};
    all.insert(all.end(), more.begin(), more.end());
    return all;
  }

  // trainer_program writing into DIR/NAME, its runs under DIR/RUNS; under `lockstep launch`
  // (`grace` seconds) when `grace` is not empty, else self-launched.
  StartedCommand start(const std::string& name, const std::vector<std::string>& flags, const std::string& runs,
                       const std::string& grace = "") {
    std::filesystem::create_directories(dir / name);
    std::vector<std::string> argv;
    if (!grace.empty()) {
      argv = {std::string(LOCKSTEP_BIN_DIR) + "/lockstep", "launch", "--nproc-per-node", "2", "--grace-period", grace, "--"};
    }
    argv.insert(argv.end(), {std::string(LOCKSTEP_BIN_DIR) + "/../tests/trainer_program", "--out", dir / name,
                             "--default-root-dir", dir / runs, "--timeout", "60"});
    argv.insert(argv.end(), flags.begin(), flags.end());
    // TMPDIR: the job's rendezvous file and launcher folders go inside `dir`, even when killed.
    return testing::start_command(argv, {{"PATH", "/usr/bin:/bin"}, {"OMP_NUM_THREADS", "1"}, {"TMPDIR", dir.path()}});
  }

  CommandResult run(const std::string& name, const std::vector<std::string>& flags, const std::string& runs,
                    const std::string& grace = "") {
    return testing::finish_command(start(name, flags, runs, grace), std::chrono::seconds(60));
  }

  // Starts the job with every rank pausing `pause_ms` after its first batch, and once rank 0
  // paused sends SIGINT `times` times to the command's process group, each after the one before
  // was delivered.
  CommandResult interrupt(const std::string& name, std::vector<std::string> flags, const std::string& runs, int times,
                          const std::string& grace = "", int pause_ms = 1500) {
    flags.insert(flags.end(), {"--pause-ms", std::to_string(pause_ms)});
    const auto job = start(name, flags, runs, grace);
    const auto paused = std::filesystem::path(dir / name) / "paused.0";
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!std::filesystem::exists(paused) && alive(job.pid) && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_TRUE(std::filesystem::exists(paused)) << "rank 0 never paused";
    for (int i = 0; i < times && std::filesystem::exists(paused); ++i) {
      for (int wait = 0; wait < 1000 && sigint_pending(job.pid); ++wait) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      ::kill(-job.pid, SIGINT);
    }
    return testing::finish_command(job, std::chrono::seconds(60));
  }

  std::filesystem::path last_ckpt(const std::string& runs) const {
    return std::filesystem::path(dir / runs) / "lockstep_logs" / "version_0" / "checkpoints" / "last.ckpt";
  }

  // The stop's one line: it names last.ckpt and the flag to resume, and last.ckpt holds the step
  // it names, mid-epoch.
  void expect_one_saving_stop(const CommandResult& stopped, const std::string& runs) {
    EXPECT_EQ(stopped.exit_code, 130) << stopped.err;
    EXPECT_EQ(count(stopped.err, "every rank stopped"), 1u) << "one line, from rank 0 alone:\n" << stopped.err;
    EXPECT_EQ(count(stopped.err, "SIGINT (Ctrl-C) reached rank "), 1u) << stopped.err;
    EXPECT_NE(stopped.err.find("and saved " + last_ckpt(runs).string() + ". Continue with --ckpt-path last."),
              std::string::npos) << stopped.err;
    // No worker is reported as failed: the job ended as asked.
    EXPECT_EQ(stopped.err.find("exited with code"), std::string::npos) << stopped.err;
    EXPECT_EQ(stopped.err.find("ending local rank 0"), std::string::npos) << stopped.err;
    std::smatch where;
    ASSERT_TRUE(std::regex_search(stopped.err, where, std::regex(R"(stopped after step (\d+) \(epoch (\d+), batch (\d+) of 8\))")))
        << stopped.err;
    ASSERT_TRUE(std::filesystem::exists(last_ckpt(runs)));
    const auto ckpt = checkpoint::CheckpointIO().load(last_ckpt(runs).string());
    const auto loops = ckpt.at("loops").toGenericDict();
    EXPECT_EQ(ckpt.at("global_step").toInt(), std::stoll(where[1]));
    EXPECT_EQ(loops.at("next_epoch").toInt(), std::stoll(where[2]));
    EXPECT_EQ(loops.at("next_batch").toInt(), std::stoll(where[3]));
    EXPECT_GT(loops.at("next_batch").toInt(), 0) << "mid-epoch";
    EXPECT_LT(loops.at("next_batch").toInt(), 8) << "mid-epoch";
    std::cout << "[ interrupted ] " << where[0] << "\n";
  }

  testing::TempDir dir{"trainer_interrupt"};
};

class TrainerInterruptSelfLaunched : public TrainerInterrupt, public ::testing::WithParamInterface<const char*> {};

// Re-executed (ddp) and forked (ddp_fork) ranks: one line, exit 130, last.ckpt of the step it
// names, and `--ckpt-path last` ends bit for bit where the run that was never interrupted ends.
TEST_P(TrainerInterruptSelfLaunched, CtrlCSavesLastOnceAndResumesBitForBit) {
  const auto whole = run("whole", flags(GetParam()), "whole_runs");
  ASSERT_EQ(whole.exit_code, 0) << whole.err;
  const auto stopped = interrupt("stopped", flags(GetParam()), "runs", 1);
  expect_one_saving_stop(stopped, "runs");
  const auto resumed = run("resumed", flags(GetParam(), {"--ckpt-path", "last"}), "runs");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_NE(resumed.err.find("lockstep: resuming from " + last_ckpt("runs").string()), std::string::npos) << resumed.err;
  const auto expected = testing::written_parameters(dir / "whole"), got = testing::written_parameters(dir / "resumed");
  ASSERT_EQ(expected.size(), 2u);
  ASSERT_EQ(got.size(), 2u);
  for (int rank = 0; rank < 2; ++rank) EXPECT_EQ(testing::max_diff(expected[rank], got[rank]), 0.0) << "rank " << rank;
}

INSTANTIATE_TEST_SUITE_P(Strategies, TrainerInterruptSelfLaunched, ::testing::Values("ddp", "ddp_fork"));

// `lockstep launch` forwards Ctrl-C to both ranks: the same stop, and the same resume under it.
TEST_F(TrainerInterrupt, CtrlCToLockstepLaunchSavesLastOnceAndResumesBitForBit) {
  const auto whole = run("whole", flags("ddp"), "whole_runs", "30");
  ASSERT_EQ(whole.exit_code, 0) << whole.err;
  const auto stopped = interrupt("stopped", flags("ddp"), "runs", 1, "30");
  expect_one_saving_stop(stopped, "runs");
  EXPECT_EQ(count(stopped.err, "received signal 2 (Interrupt); forwarding it to 2 worker(s)"), 1u) << stopped.err;
  const auto resumed = run("resumed", flags("ddp", {"--ckpt-path", "last"}), "runs", "30");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  const auto expected = testing::written_parameters(dir / "whole"), got = testing::written_parameters(dir / "resumed");
  ASSERT_EQ(expected.size(), 2u);
  ASSERT_EQ(got.size(), 2u);
  for (int rank = 0; rank < 2; ++rank) EXPECT_EQ(testing::max_diff(expected[rank], got[rank]), 0.0) << "rank " << rank;
}

// A second Ctrl-C during the 30 s pause ends the job there: without it the ranks would stop after
// the pause and save (and `lockstep launch` would wait its 60 s grace period for them).
TEST_F(TrainerInterrupt, ASecondCtrlCEndsAtOnceWithoutSaving) {
  for (const std::string grace : {"", "60"}) {
    SCOPED_TRACE(grace.empty() ? "self-launched" : "lockstep launch");
    const std::string runs = grace.empty() ? "self_runs" : "launch_runs";
    const auto ended = interrupt(runs + "_out", flags("ddp"), runs, 2, grace, 30000);
    EXPECT_EQ(ended.exit_code, 130) << ended.err;
    EXPECT_FALSE(std::filesystem::exists(last_ckpt(runs)));
    EXPECT_EQ(ended.err.find("every rank stopped"), std::string::npos) << ended.err;
    if (!grace.empty()) EXPECT_NE(ended.err.find("received signal 2 (Interrupt) again; killing 2 worker(s)"), std::string::npos) << ended.err;
  }
}

// --enable-checkpointing false: the ranks still stop together and exit 130, saving nothing.
TEST_F(TrainerInterrupt, WithoutCheckpointingCtrlCStopsWithoutSaving) {
  const auto stopped = interrupt("stopped", flags("ddp", {"--enable-checkpointing", "false"}), "runs", 1);
  EXPECT_EQ(stopped.exit_code, 130) << stopped.err;
  EXPECT_EQ(count(stopped.err, "; nothing saved (--enable-checkpointing false)."), 1u) << stopped.err;
  EXPECT_FALSE(std::filesystem::exists(last_ckpt("runs")));
}

}  // namespace trainer_interrupt_test
}  // namespace lockstep
