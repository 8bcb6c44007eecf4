// The Trainer with --devices 2 --strategy ddp, as real processes (the subprocess launcher
// re-executes tests/programs/trainer_program): parity with one process, exact resume.
#include <sched.h>
#include <signal.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <fstream>
#include <iostream>
#include <set>
#include <thread>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <lockstep/environments/local_environment.h>

#include "../../support/command.h"
#include "../../support/paths.h"
#include "../../support/time_saves.h"
#include "../../support/written_parameters.h"

namespace lockstep {
namespace {

class TrainerDDP : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = std::filesystem::temp_directory_path() / ("trainer_ddp_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  void TearDown() override { std::filesystem::remove_all(dir); }

  // Runs the program into DIR/NAME (its runs under DIR/RUNS) and returns what it said.
  testing::CommandResult start(const std::string& name, std::vector<std::string> flags, const std::string& runs = "runs",
                               const std::map<std::string, std::string>& extra_env = {}) {
    const auto out = dir / name;
    std::filesystem::create_directories(out);
    std::vector<std::string> argv{std::string(LOCKSTEP_BIN_DIR) + "/../tests/trainer_program", "--out", out.string(),
                                  "--default-root-dir", (dir / runs).string(), "--timeout", "60"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    std::map<std::string, std::string> env{{"PATH", "/usr/bin:/bin"}, {"OMP_NUM_THREADS", "1"}};
    for (const auto& [name, value] : extra_env) env[name] = value;
    // Under scripts/test --sanitize: whole allocation stacks, which the suppression of LibTorch's
    // thread pool leaked in forked workers needs (scripts/sanitizers/lsan.supp).
    if (const char* asan = std::getenv("ASAN_OPTIONS")) env["ASAN_OPTIONS"] = std::string(asan) + ":fast_unwind_on_malloc=0";
    return testing::run_command(argv, env, std::chrono::seconds(90));
  }

  // Each rank's parameters, as the program wrote them into DIR/NAME.
  std::vector<std::vector<torch::Tensor>> params_of(const std::string& name) {
    return testing::written_parameters(dir / name);
  }

  // Runs the program into DIR/NAME with a pause after every rank's first batch, during which rank
  // 0 gets `signal`.
  testing::CommandResult signal_during_pause(const std::string& name, std::vector<std::string> flags, int signal,
                                             const std::string& runs, const std::map<std::string, std::string>& env = {}) {
    flags.insert(flags.end(), {"--pause-ms", "1500"});
    testing::CommandResult result;
    std::thread job([&] { result = start(name, flags, runs, env); });
    const auto paused = dir / name / "paused.0";
    for (int i = 0; i < 6000 && !std::filesystem::exists(paused); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    pid_t rank0 = 0;
    std::ifstream(paused) >> rank0;
    if (rank0 > 0) ::kill(rank0, signal);
    job.join();
    EXPECT_GT(rank0, 0) << "rank 0 never paused: " << result.err;
    return result;
  }

  // Runs the program into DIR/NAME and returns each rank's parameters.
  std::vector<std::vector<torch::Tensor>> run(const std::string& name, std::vector<std::string> flags,
                                              const std::string& runs = "runs") {
    const auto result = start(name, std::move(flags), runs);
    EXPECT_EQ(result.exit_code, 0) << name << ": " << result.err;
    return params_of(name);
  }

  static double max_diff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
    return testing::max_diff(a, b);
  }

  std::filesystem::path dir;
};

TEST_F(TrainerDDP, TwoRanksEqualOneProcessOnTheFullBatch) {
  for (const char* optimizer : {"sgd", "adam"}) {
    std::vector<std::string> extra;
    if (std::string(optimizer) == "adam") extra.push_back("--adam");
    auto one = extra;
    one.insert(one.end(), {"--devices", "1", "--batch-size", "16", "--max-epochs", "2"});
    auto two = extra;
    two.insert(two.end(), {"--devices", "2", "--strategy", "ddp", "--batch-size", "8", "--max-epochs", "2"});
    auto single = run(std::string("single_") + optimizer, one);
    auto ddp = run(std::string("ddp_") + optimizer, two);
    ASSERT_EQ(single.size(), 1u);
    ASSERT_EQ(ddp.size(), 2u) << "both ranks must write their parameters";
    EXPECT_EQ(max_diff(ddp[0], ddp[1]), 0.0) << optimizer << ": replicas diverged";
    EXPECT_LE(max_diff(ddp[0], single[0]), 1e-6) << optimizer;
  }
}

// --scale-batch-size and --lr-find on 2 ranks: the finder's loss is averaged over the ranks each
// step (an all-reduce), so both ranks find the same rate and size without a broadcast; the
// searches' steps are undone, so the job then trains as one given that rate and size.
TEST_F(TrainerDDP, TunersAgreeOnTwoRanksAndLeaveNoTrace) {
  const std::vector<std::string> job{"--devices", "2", "--strategy", "ddp", "--max-epochs", "2", "--adam"};
  auto tuning = job;
  tuning.insert(tuning.end(), {"--lr-find", "--scale-batch-size", "power"});
  const auto tuned = run("tuned", tuning);
  ASSERT_EQ(tuned.size(), 2u) << "both ranks must write their parameters";
  std::string lr[2];
  int64_t batch_size[2] = {0, 0};
  for (int rank : {0, 1}) std::ifstream(dir / "tuned" / ("tuned." + std::to_string(rank))) >> lr[rank] >> batch_size[rank];
  EXPECT_EQ(lr[0], lr[1]) << "the ranks found different learning rates";
  EXPECT_EQ(batch_size[0], 32) << "64 examples: 32 a rank, the most a batch can hold";
  EXPECT_EQ(batch_size[1], 32);
  EXPECT_EQ(max_diff(tuned[0], tuned[1]), 0.0) << "replicas diverged";
  auto given = job;
  given.insert(given.end(), {"--lr", lr[0], "--batch-size", std::to_string(batch_size[0])});
  const auto plain = run("given", given);
  ASSERT_EQ(plain.size(), 2u);
  EXPECT_EQ(max_diff(tuned[0], plain[0]), 0.0) << "the searches left a trace (lr " << lr[0] << ")";
  std::cout << "[ tuners on 2 ranks ] lr " << lr[0] << ", batch size " << batch_size[0] << "\n";
}

// Manual optimisation whose training_step calls loss.backward() itself (once, or twice on half
// the loss): the gradients are averaged as with manual_backward, and 2 ranks equal 1 process on
// the doubled batch. The Trainer cannot see the step's forwards, so every backward in the step
// is synchronised.
TEST_F(TrainerDDP, ManualOptimisationWithPlainBackwardEqualsOneProcess) {
  auto single = run("manual_single", {"--manual", "plain", "--adam", "--devices", "1", "--batch-size", "16", "--max-epochs", "2"});
  ASSERT_EQ(single.size(), 1u);
  for (const char* how : {"plain", "twice", "manual_backward"}) {
    auto ddp = run(std::string("manual_") + how, {"--manual", how, "--adam", "--devices", "2", "--strategy", "ddp",
                                                  "--batch-size", "8", "--max-epochs", "2"});
    ASSERT_EQ(ddp.size(), 2u) << how << ": both ranks must write their parameters";
    EXPECT_EQ(max_diff(ddp[0], ddp[1]), 0.0) << how << ": replicas diverged";
    EXPECT_LE(max_diff(ddp[0], single[0]), 1e-6) << how;
    std::cout << "[ manual optimisation ] " << how << ": max |diff| to one process " << max_diff(ddp[0], single[0]) << "\n";
  }
}

// ddp_fork: rank 1 is forked from rank 0 inside fit() instead of re-executed; the job is the same.
TEST_F(TrainerDDP, ForkedRanksTrainLikeReexecutedOnes) {
  const std::vector<std::string> flags{"--devices", "2", "--batch-size", "8", "--max-epochs", "2"};
  auto forked_flags = flags, popen_flags = flags;
  forked_flags.insert(forked_flags.end(), {"--strategy", "ddp_fork"});
  popen_flags.insert(popen_flags.end(), {"--strategy", "ddp"});
  auto forked = run("forked", forked_flags);
  auto reexecuted = run("reexecuted", popen_flags);
  ASSERT_EQ(forked.size(), 2u) << "both forked ranks must write their parameters";
  ASSERT_EQ(reexecuted.size(), 2u);
  EXPECT_EQ(max_diff(forked[0], forked[1]), 0.0) << "forked replicas diverged";
  EXPECT_EQ(max_diff(forked[0], reexecuted[0]), 0.0) << "forking changed the result";
}

// Loggers belong to rank 0: one a user adds on every rank must not make the other ranks claim
// run directories of their own (an empty version_1 beside rank 0's version_0).
TEST_F(TrainerDDP, LoggersOnEveryRankWriteOneRunDirectory) {
  const auto ranks = run("logged", {"--devices", "2", "--strategy", "ddp", "--max-epochs", "1", "--csv-logger"});
  ASSERT_EQ(ranks.size(), 2u);
  std::vector<std::string> versions;
  for (const auto& entry : std::filesystem::directory_iterator(dir / "runs" / "lockstep_logs")) {
    versions.push_back(entry.path().filename().string());
  }
  ASSERT_EQ(versions, std::vector<std::string>{"version_0"});
  EXPECT_TRUE(std::filesystem::exists(dir / "runs" / "lockstep_logs" / "version_0" / "metrics.csv"));
}

TEST_F(TrainerDDP, ResumeOnTwoRanksIsExact) {
  const std::string ckpt = (dir / "half.ckpt").string();
  const std::vector<std::string> common{"--devices", "2", "--strategy", "ddp", "--adam"};
  auto with = [&](std::vector<std::string> more) {
    auto flags = common;
    flags.insert(flags.end(), more.begin(), more.end());
    return flags;
  };
  auto straight = run("straight", with({"--max-epochs", "4"}));
  run("first_half", with({"--max-epochs", "2", "--save", ckpt}));
  ASSERT_TRUE(std::filesystem::exists(ckpt));
  auto resumed = run("resumed", with({"--max-epochs", "4", "--ckpt-path", ckpt}));
  ASSERT_EQ(straight.size(), 2u);
  ASSERT_EQ(resumed.size(), 2u);
  EXPECT_EQ(max_diff(straight[0], resumed[0]), 0.0);
  EXPECT_EQ(max_diff(straight[1], resumed[1]), 0.0);
}

// ModelCheckpoint's train_time_interval on 2 ranks, steps of 200 ms, 0.7 s: saves after steps 4,
// 8, 12, each give or take one (testing::expect_saves_every_0_7_seconds says why), and every rank
// takes part in the same saves (rank 0's clock decides), under DDP and under FSDP's sharded
// checkpoints, where each rank writes its own pieces.
TEST_F(TrainerDDP, TrainTimeIntervalSavesTheSameStepsOnEveryRank) {
  for (const std::string strategy : {"ddp", "fsdp"}) {
    const int64_t steps = strategy == "ddp" ? 12 : 8;
    std::vector<std::string> flags{"--devices", "2", "--strategy", strategy, "--batch-size", "2", "--max-epochs", "1",
                                   "--max-steps", std::to_string(steps), "--step-ms", "200",
                                   "--checkpoint-every-seconds", "0.7"};
    if (strategy == "fsdp") flags.insert(flags.end(), {"--fsdp-state-dict-type", "sharded"});
    ASSERT_EQ(run(strategy, flags, strategy + "_runs").size(), 2u) << strategy;
    std::vector<int64_t> saved[2];
    for (int rank : {0, 1}) {
      std::ifstream in(dir / strategy / ("saved." + std::to_string(rank)));
      for (int64_t step; in >> step;) saved[rank].push_back(step);
    }
    EXPECT_EQ(saved[0], saved[1]) << strategy << ": the ranks saved at different steps";
    testing::expect_saves_every_0_7_seconds(saved[0], 0, steps);
    const auto checkpoints = dir / (strategy + "_runs") / "lockstep_logs" / "version_0" / "checkpoints";
    for (int64_t step : saved[0]) {
      EXPECT_TRUE(std::filesystem::exists(checkpoints / ("epoch=0-step=" + std::to_string(step) + ".ckpt")))
          << strategy << " step " << step;
    }
  }
}

TEST_F(TrainerDDP, ValidationWithinTheEpochRunsOnEveryRankAtTheSameBatches) {
  // 64 examples over 2 ranks in batches of 8: 4 batches per rank and epoch, so 0.5 validates
  // after the 2nd and 4th (an interval resolved before the sampler split would see 8 batches).
  auto ranks = run("val_half", {"--devices", "2", "--strategy", "ddp", "--max-epochs", "2", "--val",
                                "--val-check-interval", "0.5"});
  ASSERT_EQ(ranks.size(), 2u);
  EXPECT_EQ(max_diff(ranks[0], ranks[1]), 0.0);
  for (int r = 0; r < 2; ++r) {
    std::ifstream count(dir / "val_half" / ("validations." + std::to_string(r)));
    int64_t validations = -1;
    count >> validations;
    EXPECT_EQ(validations, 4) << "rank " << r;
  }
}

// --inference-mode true (the default) and false validate alike under DDP and FSDP (whose gathered
// parameters must not turn into inference tensors): each rank validates as often, and the
// weights end bit for bit equal.
TEST_F(TrainerDDP, InferenceModeAndNoGradValidateAlikeUnderDdpAndFsdp) {
  for (const std::string strategy : {"ddp", "fsdp"}) {
    std::map<std::string, std::vector<std::vector<torch::Tensor>>> ranks;
    for (const std::string mode : {"true", "false"}) {
      const std::string name = strategy + "_inference_" + mode;
      ranks[mode] = run(name, {"--devices", "2", "--strategy", strategy, "--max-epochs", "2", "--adam", "--val",
                               "--val-check-interval", "0.5", "--inference-mode", mode});
      for (int r = 0; r < 2; ++r) {
        int64_t validations = -1;
        std::ifstream(dir / name / ("validations." + std::to_string(r))) >> validations;
        EXPECT_EQ(validations, 4) << name << " rank " << r;
      }
    }
    ASSERT_EQ(ranks["true"].size(), 2u);
    ASSERT_EQ(ranks["false"].size(), 2u);
    for (int r = 0; r < 2; ++r) EXPECT_EQ(max_diff(ranks["true"][r], ranks["false"][r]), 0.0) << strategy;
  }
}

// --deterministic true on two ranks: two runs end with the same bits. On the CPU they would
// without the flag too (Gloo adds the ranks' gradients in a fixed order for a given world size);
// the flag makes LibTorch refuse the operations that would not (TrainerDeterminism).
TEST_F(TrainerDDP, TwoDeterministicRunsEndBitForBitAlike) {
  const std::vector<std::string> flags{"--devices", "2", "--strategy", "ddp", "--max-epochs", "2", "--adam",
                                       "--deterministic", "true"};
  auto first = run("deterministic_1", flags, "runs_1");
  auto second = run("deterministic_2", flags, "runs_2");
  ASSERT_EQ(first.size(), 2u);
  ASSERT_EQ(second.size(), 2u);
  for (int r = 0; r < 2; ++r) EXPECT_EQ(max_diff(first[r], second[r]), 0.0);
}

// A checkpoint of a wider model given to a 2-rank job: one message, from one process, before any
// rank starts, naming a fix that exists (not a strict=false the Trainer has no flag for), and no
// empty run folder left behind; found by --ckpt-path last, one message too.
TEST_F(TrainerDDP, AWiderModelsCheckpointIsOneMessageOnceAndLeavesNoRunFolder) {
  run("wide", {"--devices", "1", "--max-epochs", "1", "--features", "10"}, "runs_wide");
  const auto ckpt = (dir / "runs_wide/lockstep_logs/version_0/checkpoints/last.ckpt").string();
  const auto result = start("narrow", {"--devices", "2", "--max-epochs", "1", "--ckpt-path", ckpt}, "runs_narrow");
  EXPECT_EQ(result.exit_code, 2) << result.err;
  const std::string message = "trainer_program: error: --ckpt-path " + ckpt + ": the checkpoint does not match the " +
                              "model (size mismatch for fc1.weight: the checkpoint has [16, 10], the model [16, 8]). ";
  const auto at = result.err.find(message);
  ASSERT_NE(at, std::string::npos) << result.err;
  EXPECT_EQ(result.err.find(message, at + 1), std::string::npos) << "printed twice: " << result.err;
  EXPECT_NE(result.err.find("resume with the module it was saved from"), std::string::npos) << result.err;
  EXPECT_EQ(result.err.find("strict=false"), std::string::npos) << result.err;
  EXPECT_EQ(result.err.find("worker"), std::string::npos) << "a rank was started: " << result.err;
  std::error_code none;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir / "runs_narrow", none)) {
    ADD_FAILURE() << "left behind: " << entry.path();
  }
  // --ckpt-path last is found once the ranks run: each finds the mismatch, rank 0 alone says it.
  const auto last = start("narrow_last", {"--devices", "2", "--max-epochs", "1", "--ckpt-path", "last"}, "runs_wide");
  EXPECT_EQ(last.exit_code, 2) << last.err;
  const auto first = last.err.find("trainer_program: error: --ckpt-path " + ckpt + ": the checkpoint does not match");
  ASSERT_NE(first, std::string::npos) << last.err;
  EXPECT_EQ(last.err.find("trainer_program: error:", first + 1), std::string::npos) << "printed twice: " << last.err;
  EXPECT_EQ(last.err.find("worker"), std::string::npos) << last.err;
  EXPECT_FALSE(std::filesystem::exists(dir / "runs_wide/lockstep_logs/version_1")) << "an empty run folder was left";
}

// Rank 0's own failure ends a self-launched job at once with rank 0's code: the worker is told,
// not waited for (60 s at exit before), and not blamed. A worker's failure is still reported as
// before.
TEST_F(TrainerDDP, RankZerosFailureEndsTheJobAtOnceWithItsCode) {
  for (int failing : {0, 1}) {
    const auto out = dir / ("fail_" + std::to_string(failing));
    std::filesystem::create_directories(out);
    const auto start = std::chrono::steady_clock::now();
    const auto result = testing::run_command(
        {std::string(LOCKSTEP_BIN_DIR) + "/../tests/trainer_program", "--out", out.string(), "--default-root-dir",
         (dir / "runs").string(), "--timeout", "60", "--devices", "2", "--strategy", "ddp", "--max-epochs", "2",
         "--fail-on-rank", std::to_string(failing)},
        {{"PATH", "/usr/bin:/bin"}, {"OMP_NUM_THREADS", "1"}}, std::chrono::seconds(90));
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(result.exit_code, 1) << "rank " << failing << ": " << result.err;
    EXPECT_LT(seconds, 20.0) << "rank " << failing << ": " << result.err;
    EXPECT_NE(result.err.find("rank " + std::to_string(failing) + " fails on purpose"), std::string::npos) << result.err;
    if (failing == 0) {
      EXPECT_NE(result.err.find("local rank 0 failed (exit code 1); terminating 1 other worker(s) without waiting"),
                std::string::npos) << result.err;
      EXPECT_EQ(result.err.find("worker local_rank=1"), std::string::npos) << "the worker was blamed: " << result.err;
      EXPECT_EQ(result.err.find("still ran"), std::string::npos) << result.err;
    } else {
      EXPECT_NE(result.err.find("worker local_rank=1"), std::string::npos) << result.err;
    }
  }
}

// A NaN loss on one rank stops every rank after the same step, naming the rank and the step,
// before the job goes on training on NaN weights; with one process, after that very step.
TEST_F(TrainerDDP, ANanLossOnOneRankStopsEveryRankAfterTheSameStep) {
  const auto two = start("nan_two", {"--devices", "2", "--strategy", "ddp", "--max-epochs", "3", "--nan-at-step", "3",
                                     "--nan-on-rank", "1"});
  EXPECT_EQ(two.exit_code, 1) << two.err;
  EXPECT_NE(two.err.find("rank 1 got a nan loss in step 3 (epoch 0, batch 2)"), std::string::npos) << two.err;
  EXPECT_TRUE(params_of("nan_two").empty()) << "fit returned normally";
  // Each rank's error line names the step it stopped after: one step for all. (Rank 0's may be cut
  // short: its job ends with the worker's code as soon as the worker exits.)
  std::set<std::string> steps;
  int lines = 0;
  for (size_t at = two.err.find("every rank stopped after step "); at != std::string::npos;
       at = two.err.find("every rank stopped after step ", at + 1), ++lines) {
    steps.insert(two.err.substr(at, two.err.find(' ', at + 30) - at));
  }
  EXPECT_GE(lines, 1) << two.err;
  EXPECT_EQ(steps.size(), 1u) << two.err;

  const auto one = start("nan_one", {"--devices", "1", "--max-epochs", "3", "--nan-at-step", "2", "--nan-on-rank", "0"});
  EXPECT_EQ(one.exit_code, 1) << one.err;
  EXPECT_NE(one.err.find("rank 0 got a nan loss in step 2 (epoch 0, batch 1); every rank stopped after step 2 "),
            std::string::npos) << one.err;
  EXPECT_NE(one.err.find("--detect-anomaly true"), std::string::npos) << one.err;
}

// --detect-anomaly: the backward that makes the NaN names its operation (autograd's anomaly mode).
TEST_F(TrainerDDP, DetectAnomalyNamesTheOperationThatMadeANan) {
  const auto result = start("anomaly", {"--devices", "1", "--max-epochs", "1", "--nan-at-step", "2", "--nan-on-rank",
                                        "0", "--detect-anomaly", "true"});
  EXPECT_EQ(result.exit_code, 1) << result.err;
  EXPECT_NE(result.err.find("Function 'MulBackward"), std::string::npos) << result.err;  // 0 or 1 by LibTorch version
  EXPECT_NE(result.err.find("returned nan values"), std::string::npos) << result.err;
}

// SIGTERM to rank 0 mid-epoch: every rank stops after the same step, last.ckpt holds the loop's
// position, and --ckpt-path last ends bit for bit where the uninterrupted run ends (Adam,
// shuffled data).
TEST_F(TrainerDDP, ASignalledJobSavesLastAndResumesBitForBit) {
  const std::vector<std::string> flags{"--devices", "2", "--strategy", "ddp", "--adam", "--max-epochs", "3"};
  auto with = [&](std::vector<std::string> more) {
    auto all = flags;
    all.insert(all.end(), more.begin(), more.end());
    return all;
  };
  const auto uninterrupted = run("whole", flags);
  const auto stopped = signal_during_pause("stopped", with({}), SIGTERM, "pair");
  EXPECT_EQ(stopped.exit_code, 128 + SIGTERM) << stopped.err;
  EXPECT_NE(stopped.err.find("SIGTERM reached rank 0 after step "), std::string::npos) << stopped.err;
  EXPECT_NE(stopped.err.find("Continue with --ckpt-path last."), std::string::npos) << stopped.err;
  // Mid-epoch: 4 batches an epoch; the ranks stop within the first epoch, before its end.
  EXPECT_NE(stopped.err.find("(epoch 0, batch "), std::string::npos) << stopped.err;
  EXPECT_EQ(stopped.err.find("(epoch 0, batch 4 of 4)"), std::string::npos) << stopped.err;
  EXPECT_TRUE(std::filesystem::exists(dir / "pair" / "lockstep_logs" / "version_0" / "checkpoints" / "last.ckpt"));

  const auto resumed = run("resumed", with({"--ckpt-path", "last"}), "pair");
  ASSERT_EQ(uninterrupted.size(), 2u);
  ASSERT_EQ(resumed.size(), 2u);
  EXPECT_EQ(max_diff(uninterrupted[0], resumed[0]), 0.0);
  EXPECT_EQ(max_diff(uninterrupted[1], resumed[1]), 0.0);
}

// SLURM's warning before the time limit (sbatch --signal=USR1@90): last.ckpt, then rank 0 asks
// SLURM to queue the job again (a stand-in scontrol records the call).
TEST_F(TrainerDDP, SigusrOneUnderSlurmSavesAndRequeuesTheJob) {
  const auto bin = dir / "bin";
  std::filesystem::create_directories(bin);
  const auto calls = dir / "scontrol.calls";
  { std::ofstream(bin / "scontrol") << "#!/bin/sh\necho \"$@\" >> " << calls.string() << "\n"; }
  std::filesystem::permissions(bin / "scontrol", std::filesystem::perms::owner_all);
  const auto result = signal_during_pause("usr1", {"--devices", "1", "--max-epochs", "3"}, SIGUSR1, "usr1_runs",
                                          {{"SLURM_JOB_ID", "4242"}, {"PATH", bin.string() + ":/usr/bin:/bin"}});
  EXPECT_EQ(result.exit_code, 128 + SIGUSR1) << result.err;
  EXPECT_NE(result.err.find("SIGUSR1 reached the process after step "), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("Requeued SLURM job 4242 (scontrol requeue)"), std::string::npos) << result.err;
  EXPECT_EQ(testing::slurp(calls.string()), "requeue 4242\n");
  EXPECT_TRUE(std::filesystem::exists(dir / "usr1_runs" / "lockstep_logs" / "version_0" / "checkpoints" / "last.ckpt"));
}

// Self-launch with --max-restarts 1: rank 1 crashes once after step 6 (epoch 1); rank 0 ends the
// job and starts the program again, which resumes from last.ckpt (--ckpt-path last) and ends bit
// for bit where the job without the crash ends. A failure that comes back every time gives up
// after the last restart with its code.
TEST_F(TrainerDDP, SelfLaunchRestartsAndEndsAsTheJobWithoutTheCrash) {
  const std::vector<std::string> flags{"--devices", "2", "--strategy", "ddp", "--adam", "--max-epochs", "3",
                                       "--ckpt-path", "last", "--max-restarts", "1"};
  auto with = [&](std::vector<std::string> more) {
    auto all = flags;
    all.insert(all.end(), more.begin(), more.end());
    return all;
  };
  const auto uninterrupted = run("whole", flags, "whole_runs");
  const auto crashed = start("crashed", with({"--crash-at-step", "6", "--crash-on-rank", "1"}), "crashed_runs");
  EXPECT_EQ(crashed.exit_code, 0) << crashed.err;
  EXPECT_NE(crashed.err.find("rank 1 crashes after step 6 on purpose"), std::string::npos) << crashed.err;
  EXPECT_NE(crashed.err.find("restarting the job (restart 1 of 1) after worker local_rank=1 failed with exit code 3"),
            std::string::npos) << crashed.err;
  EXPECT_NE(crashed.err.find("lockstep: resuming from"), std::string::npos) << crashed.err;
  EXPECT_NE(crashed.err.find("the job succeeded after 1 restart(s)"), std::string::npos) << crashed.err;
  const auto resumed = params_of("crashed");
  ASSERT_EQ(uninterrupted.size(), 2u);
  ASSERT_EQ(resumed.size(), 2u);
  EXPECT_EQ(max_diff(uninterrupted[0], resumed[0]), 0.0);
  EXPECT_EQ(max_diff(uninterrupted[1], resumed[1]), 0.0);

  const auto always = start("always", with({"--fail-on-rank", "0"}), "always_runs");
  EXPECT_EQ(always.exit_code, 1) << always.err;
  EXPECT_NE(always.err.find("restarting the job (restart 1 of 1) after local rank 0 failed with exit code 1"),
            std::string::npos) << always.err;
  EXPECT_NE(always.err.find("giving up after 1 restart(s) (--max-restarts 1); local rank 0 failed with exit code 1"),
            std::string::npos) << always.err;
}

// More CPU ranks than cores: one warning, from the process that launches the others.
TEST_F(TrainerDDP, MoreRanksThanCoresIsAWarningOnce) {
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  ASSERT_EQ(::sched_getaffinity(0, sizeof(cpus), &cpus), 0);
  const int cores = CPU_COUNT(&cpus);
  const auto out = dir / "oversubscribed";
  std::filesystem::create_directories(out);
  const auto result = testing::run_command(
      {std::string(LOCKSTEP_BIN_DIR) + "/../tests/trainer_program", "--out", out.string(), "--default-root-dir",
       (dir / "runs").string(), "--timeout", "60", "--devices", std::to_string(cores + 1), "--strategy", "ddp",
       "--max-epochs", "1"},
      {{"PATH", "/usr/bin:/bin"}, {"OMP_NUM_THREADS", "1"}}, std::chrono::seconds(90));
  EXPECT_EQ(result.exit_code, 0) << result.err;
  const std::string warning = "lockstep: warning: --devices " + std::to_string(cores + 1) + " starts " +
                              std::to_string(cores + 1) + " processes on " + std::to_string(cores) + " CPU core(s)";
  const auto at = result.err.find(warning);
  EXPECT_NE(at, std::string::npos) << result.err;
  EXPECT_EQ(result.err.find(warning, at + 1), std::string::npos) << "said twice: " << result.err;
}

// Lightning's manual multi-node recipe, two "nodes" on this machine: the same command started twice
// with NODE_RANK 0 and 1, MASTER_ADDR, MASTER_PORT and WORLD_SIZE; each starts its node's rank, and
// the job equals one process on the whole batch.
TEST_F(TrainerDDP, TheManualTwoNodeRecipeEqualsOneProcessOnTheFullBatch) {
  auto single = run("single", {"--devices", "1", "--batch-size", "16", "--max-epochs", "2"});
  const std::string port = std::to_string(environments::find_free_port());
  const std::vector<std::string> flags{"--devices", "1", "--num-nodes", "2", "--batch-size", "8", "--max-epochs", "2"};
  testing::CommandResult node[2];
  std::thread second([&] {
    node[1] = start("nodes", flags, "runs", {{"NODE_RANK", "1"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", port},
                                             {"WORLD_SIZE", "2"}});
  });
  node[0] = start("nodes", flags, "runs", {{"NODE_RANK", "0"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", port},
                                           {"WORLD_SIZE", "2"}});
  second.join();
  ASSERT_EQ(node[0].exit_code, 0) << node[0].err;
  ASSERT_EQ(node[1].exit_code, 0) << node[1].err;
  const auto ranks = params_of("nodes");
  ASSERT_EQ(ranks.size(), 2u) << "both nodes' ranks must write their parameters";
  ASSERT_EQ(single.size(), 1u);
  EXPECT_EQ(max_diff(ranks[0], ranks[1]), 0.0) << "replicas diverged";
  EXPECT_LE(max_diff(ranks[0], single[0]), 1e-6);
}

}  // namespace
}  // namespace lockstep
