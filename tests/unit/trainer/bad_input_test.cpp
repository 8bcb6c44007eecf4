// Bad input to a Trainer program, run as a user runs it: every case exits with code 2 and one
// message that names what to do instead. No stack trace, no abort.
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include <lockstep/environments/cluster_environment.h>

#include "../../support/command.h"
#include "../../support/paths.h"

namespace lockstep {
namespace {

struct BadInput {
  std::vector<std::string> args;
  std::map<std::string, std::string> env;
  std::string needle;  // part of the fix the message must name
};

class TrainerBadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = std::filesystem::temp_directory_path() / ("bad_input_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir / "runs");
    std::ofstream(dir / "notes.ckpt") << "not a checkpoint\n";
    std::ofstream(dir / "truncated.ckpt") << std::string("PK\x03\x04", 4) << std::string(40, 'x');
  }
  void TearDown() override { std::filesystem::remove_all(dir); }
  std::filesystem::path dir;
};

std::map<std::string, std::string> slurm_job() {
  auto vars = environments::Environ::from_env_file(std::string(LOCKSTEP_SOURCE_DIR) +
                                                   "/tests/fixtures/environments/slurm_srun_rank5.env")
                  .vars();
  return vars;
}

TEST_F(TrainerBadInput, EveryCaseExitsTwoAndNamesTheFix) {
  const std::string d = dir.string();
  std::vector<BadInput> cases = {
      {{"--devices", "0"}, {}, "at least 1"},
      {{"--devices", "two"}, {}, "--devices 2"},
      {{"--devices", "0,1"}, {}, "--accelerator cuda"},
      {{"--accelerator", "cuda"}, {}, "--accelerator cpu"},
      {{"--accelerator", "gpu", "--devices", "1"}, {}, "--accelerator cpu"},
      {{"--accelerator", "tpu"}, {}, "does not apply to LibTorch"},
      {{"--accelerator", "mps"}, {}, "--accelerator cpu, cuda or auto"},
      {{"--accelerator", "horovod"}, {}, "--strategy ddp"},
      {{"--accelerator", "abacus"}, {}, "auto, cpu, cuda or gpu"},
      {{"--strategy", "deepspeed"}, {}, "Use --strategy ddp"},
      {{"--strategy", "fsdp", "--fsdp-sharding", "ZERO9"}, {}, "--fsdp-sharding: unknown sharding strategy 'ZERO9'"},
      {{"--fsdp-auto-wrap-min-params", "1000"}, {}, "but the strategy is single_device. Add --strategy fsdp, or drop it"},
      {{"--strategy", "ddp", "--fsdp-sharding", "FULL_SHARD"}, {}, "--fsdp-sharding FULL_SHARD is for --strategy fsdp"},
      {{"--strategy", "ddp"}, {{"LOCKSTEP_TRAINER_FSDP_STATE_DICT_TYPE", "full"}},
       "--fsdp-state-dict-type full is for --strategy fsdp"},
      {{"--strategy", "fsdp_hybrid_shard", "--fsdp-hybrid-shard-size", "3"}, {}, "hybrid_shard_size 3 does not divide"},
      {{"--strategy", "fsdp", "--fsdp-state-dict-type", "local"}, {}, "--fsdp-state-dict-type: unknown state dict type 'local'"},
      {{"--fsdp-state-dict-type", "sharded"}, {}, "Add --strategy fsdp, or drop it"},
      {{"--fsdp-activation-checkpointing-types", "Linear"}, {}, "Add --strategy fsdp, or drop it"},
      {{"--strategy", "fsdp", "--fsdp-hybrid-shard-size", "2"}, {}, "Add --fsdp-sharding HYBRID_SHARD, or drop it"},
      {{"--strategy", "fsdp", "--fsdp-sharding", "HYBRID_SHARD", "--fsdp-hybrid-shard-size", "3"}, {},
       "hybrid_shard_size 3 does not divide"},
      {{"--strategy", "fsdp", "--fsdp-auto-wrap-types", "Block"}, {}, "no child of a torch::nn::Sequential"},
      {{"--fsdp-param-dtype", "bf16"}, {}, "Add --strategy fsdp, or use --precision bf16-mixed"},
      {{"--strategy", "fsdp", "--fsdp-reduce-dtype", "int8"}, {}, "--fsdp-reduce-dtype 'int8' is not known"},
      {{"--strategy", "fsdp", "--fsdp-param-dtype", "16"}, {}, "Use --fsdp-param-dtype bf16, or --accelerator cuda"},
      {{"--strategy", "fsdp", "--fsdp-param-dtype", "bf16"}, {}, "applies to child units, and the module has none"},
      {{"--strategy", "dp"}, {}, "Use --strategy ddp"},
      {{"--strategy", "ddp_spawn"}, {}, "ddp_fork"},
      {{"--strategy", "nope"}, {}, "Use auto or one of"},
      {{"--strategy", "single_device", "--devices", "2"}, {}, "Use --strategy ddp, or --devices 1"},
      {{"--precision", "16-mixed"}, {}, "--precision bf16-mixed"},
      {{"--precision", "8"}, {}, "Use 32-true"},
      {{"--num-nodes", "2"}, {}, "lockstep launch --nnodes 2"},
      {{"--num-nodes", "0"}, {}, "--num-nodes"},
      {{"--max-epochs", "-5"}, {}, "--max-epochs"},
      {{"--accumulate-grad-batches", "0"}, {}, "--accumulate-grad-batches"},
      {{"--limit-train-batches", "lots"}, {}, "fraction (0.25) nor a batch count (10)"},
      {{"--limit-train-batches", "1.5"}, {}, "for a count write an integer"},
      {{"--gradient-clip-algorithm", "norm2"}, {}, "value"},
#ifdef USE_C10D_NCCL  // a LibTorch with NCCL: on the CPU it is refused all the same
      {{"--process-group-backend", "nccl"}, {}, "but the accelerator is cpu. Use --accelerator cuda, or --process-group-backend gloo."},
      {{"--process-group-backend", "mpi"}, {}, "can create gloo, nccl. Use --process-group-backend gloo"},
#else
      {{"--process-group-backend", "nccl"}, {}, "can create gloo. Use --process-group-backend gloo"},
      {{"--process-group-backend", "mpi"}, {}, "can create gloo. Use --process-group-backend gloo"},
#endif
      {{"--strategy", "ddp_cpu"}, {}, "Use --accelerator cpu --strategy ddp --devices N"},
      {{"--strategy", "ddp2"}, {}, "removed from Lightning 1.7. Use --strategy ddp"},
      {{"--accelerator", "ddp"}, {}, "ddp is a strategy (Lightning 1.x took it as an accelerator). Use --accelerator cpu, cuda or auto and --strategy ddp."},
      {{"--accelerator", "ddp_cpu"}, {}, "and --strategy ddp."},
      {{"--tpu-cores", "8"}, {}, "--tpu-cores: TPUs need torch_xla"},
      {{"--gpus", "2"}, {}, "--gpus: Lightning 1.7 replaced it: use --accelerator cuda --devices N"},
      {{"--num-processes", "2"}, {}, "use --accelerator cpu --devices N --strategy ddp"},
      {{"--timeout", "0"}, {}, "--timeout"},
      {{"--seed", "-7"}, {}, "--seed"},
      {{"--ckpt-path", d + "/missing.ckpt"}, {}, "missing.ckpt"},
      {{"--ckpt-path", d + "/notes.ckpt"}, {}, "notes.ckpt"},
      {{"--ckpt-path", d + "/truncated.ckpt"}, {}, "truncated.ckpt"},
      {{"--distributed-debug", "loud"}, {}, "use off (the default) or detail"},
      {{"--max-restarts", "1"}, {}, "restarts the processes the Trainer or Fabric launches on one machine"},
      {{"--max-restarts", "-1"}, {}, "--max-restarts"},
      {{"--max-restarts", "1", "--devices", "2"}, {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"},
                                                   {"GROUP_RANK", "0"}, {"LOCAL_WORLD_SIZE", "2"},
                                                   {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}},
       "not by the Trainer or Fabric. Use the restarts of what starts the processes"},
      {{"--detect-anomaly", "maybe"}, {}, "--detect-anomaly"},
      {{"--no-such-flag"}, {}, "--help"},
      {{"--max-epoch", "1"}, {}, "trainer_program: error: unknown flag --max-epoch; did you mean --max-epochs?"},
      {{"--device", "2"}, {}, "unknown flag --device; did you mean --devices?"},
      {{"--stratgy", "ddp"}, {}, "unknown flag --stratgy; did you mean --strategy?"},
      // CLI11 2.1 looped forever on this one (found by tests/fuzz/trainer_flags_fuzz.cpp).
      {{"", "--x"}, {}, "is empty and belongs to no flag; remove it (an empty value goes right after its flag"},
      {{"--max-epochs", "1", "--no-such", ""}, {}, "is empty and belongs to no flag"},
      {{"--", "--ckpt-path", "", "--max-epochs", "3"}, {}, "is empty and belongs to no flag"},
      {{}, {{"LOCKSTEP_TRAINER_DEVICES", "-3"}}, "at least 1"},
      {{}, {{"LOCKSTEP_TRAINER_STRATEGY", "horovod"}}, "Use --strategy ddp"},
      {{}, {{"LOCKSTEP_TRAINER_PRECISION", "half"}}, "Use 32-true"},
      {{}, {{"RANK", "1"}}, "WORLD_SIZE"},
      {{}, {{"RANK", "abc"}, {"WORLD_SIZE", "2"}}, "RANK=abc"},
      {{"--devices", "2", "--num-nodes", "2"}, slurm_job(), "Use --devices 4"},
      {{"--val-check-interval", "0"}, {}, "To skip validation use --limit-val-batches 0"},
      {{"--val-check-interval", "1.5"}, {}, "for a count write an integer"},
      {{"--val-check-interval", "9"}, {}, "Use at most 8, or a fraction such as 0.5"},
      {{"--val-check-interval", "often"}, {}, "neither a fraction (0.25) nor a batch count (10)"},
      {{}, {{"LOCKSTEP_TRAINER_VAL_CHECK_INTERVAL", "-2"}}, "must be 0 or more"},
      {{"--auto-select-gpus", "maybe"}, {}, "--auto-select-gpus"},
      {{"--accelerator", "cuda", "--auto-select-gpus", "true"}, {}, "--accelerator cpu"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    std::map<std::string, std::string> env{{"PATH", "/usr/bin:/bin"}, {"LOCKSTEP_NO_BLAS_WARNING", "1"}};
    for (const auto& [k, v] : cases[i].env) env[k] = v;
    // Each case a fork of a loaded trainer_program (support/fork_server.h): a process of its own, its
    // own exit code and streams, without LibTorch's 0.6 s of loading (75 cases: 74 s of the suite
    // run one by one, 2026-12-03). None of them gets as far as starting ranks.
    const std::string tests = std::string(LOCKSTEP_BIN_DIR) + "/../tests/";
    std::vector<std::string> argv{tests + "test_fork_client", "--program", tests + "trainer_program", "--out", d,
                                  "--default-root-dir", d + "/runs", "--max-epochs", "1"};
    argv.insert(argv.end(), cases[i].args.begin(), cases[i].args.end());
    auto result = testing::run_command(argv, env, std::chrono::seconds(60));
    std::string shown;
    for (const auto& a : cases[i].args) shown += a + " ";
    EXPECT_EQ(result.exit_code, 2) << "case " << i << " (" << shown << "): " << result.err;
    EXPECT_NE(result.err.find(cases[i].needle), std::string::npos)
        << "case " << i << " (" << shown << ") should name '" << cases[i].needle << "', said: " << result.err;
    EXPECT_EQ(result.err.find("terminate called"), std::string::npos) << "case " << i << ": " << result.err;
    EXPECT_FALSE(std::filesystem::exists(dir / "params.0.pt")) << "case " << i << " trained anyway";
  }
  EXPECT_GE(cases.size(), 30u);
}

// A bad --ckpt-path is found before anything is made or launched: one message (not one per rank),
// no run folder, no second process.
TEST_F(TrainerBadInput, ABadCheckpointPathIsReportedOnceBeforeAnythingIsCreated) {
  const std::string d = dir.string();
  for (const std::string& ckpt : {d + "/missing.ckpt", d + "/truncated.ckpt"}) {
    const std::string root = d + "/fresh";
    auto result = testing::run_command(
        {std::string(LOCKSTEP_BIN_DIR) + "/../tests/trainer_program", "--out", d, "--default-root-dir", root,
         "--max-epochs", "1", "--devices", "2", "--strategy", "ddp", "--ckpt-path", ckpt},
        {{"PATH", "/usr/bin:/bin"}, {"LOCKSTEP_NO_BLAS_WARNING", "1"}}, std::chrono::seconds(60));
    EXPECT_EQ(result.exit_code, 2) << ckpt << ": " << result.err;
    const auto first = result.err.find("error:");
    ASSERT_NE(first, std::string::npos) << result.err;
    EXPECT_EQ(result.err.find("error:", first + 1), std::string::npos) << ckpt << ": said twice: " << result.err;
    EXPECT_FALSE(std::filesystem::exists(root + "/lockstep_logs")) << ckpt << ": a run folder was made";
    std::filesystem::remove_all(root);
  }
}

// A bad count or fraction is refused as the flag is read, in the process the user started: one
// message, before any worker is launched or any run folder made.
TEST_F(TrainerBadInput, ABadBatchLimitExitsTwoBeforeAWorkerStarts) {
  const std::string d = dir.string();
  for (const std::string& flag : {"--limit-train-batches", "--limit-val-batches", "--val-check-interval"}) {
    const std::string root = d + "/fresh";
    auto result = testing::run_command(
        {std::string(LOCKSTEP_BIN_DIR) + "/../tests/trainer_program", "--out", d, "--default-root-dir", root,
         "--max-epochs", "1", "--devices", "2", "--strategy", "ddp", flag, "lots"},
        {{"PATH", "/usr/bin:/bin"}, {"LOCKSTEP_NO_BLAS_WARNING", "1"}}, std::chrono::seconds(60));
    EXPECT_EQ(result.exit_code, 2) << flag << ": " << result.err;
    EXPECT_NE(result.err.find(flag + " 'lots' is neither a fraction (0.25) nor a batch count (10)"), std::string::npos)
        << result.err;
    const auto first = result.err.find("error:");
    ASSERT_NE(first, std::string::npos) << result.err;
    EXPECT_EQ(result.err.find("error:", first + 1), std::string::npos) << flag << ": said twice: " << result.err;
    EXPECT_EQ(result.err.find("worker"), std::string::npos) << flag << ": a worker was started: " << result.err;
    EXPECT_FALSE(std::filesystem::exists(root)) << flag << ": a run folder was made";
  }
}

// A LOCKSTEP_TRAINER_* variable that matches no flag is not silently ignored: a warning names the
// nearest real one, and the run goes on.
TEST_F(TrainerBadInput, AnUnknownTrainerVariableIsAWarningNamingTheNearestFlag) {
  const std::string d = dir.string();
  auto result = testing::run_command(
      {std::string(LOCKSTEP_BIN_DIR) + "/../tests/trainer_program", "--out", d, "--default-root-dir", d + "/runs",
       "--max-epochs", "1"},
      {{"PATH", "/usr/bin:/bin"}, {"LOCKSTEP_NO_BLAS_WARNING", "1"}, {"LOCKSTEP_TRAINER_MAX_EPOCH", "3"}},
      std::chrono::seconds(60));
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.err.find("trainer_program: warning: LOCKSTEP_TRAINER_MAX_EPOCH matches no flag and is ignored; "
                            "did you mean LOCKSTEP_TRAINER_MAX_EPOCHS?"),
            std::string::npos) << result.err;
}

}  // namespace
}  // namespace lockstep
