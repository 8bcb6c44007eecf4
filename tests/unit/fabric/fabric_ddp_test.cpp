// Fabric across processes: tests/programs/fabric_program launched as a user launches it
// (--devices 2 re-executes it for rank 1), each rank writing what it saw.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iostream>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <lockstep/checkpoint/checkpoint_io.h>

#include "../../support/command.h"
#include "../../support/paths.h"
#include "../../support/temp_dir.h"
#include "../../support/written_parameters.h"

namespace lockstep {
namespace {

const std::string program = std::string(LOCKSTEP_BIN_DIR) + "/../tests/fabric_program";

testing::CommandResult run_program(const std::string& out, std::vector<std::string> flags) {
  std::filesystem::create_directories(out);
  std::vector<std::string> argv{program, "--out", out, "--timeout", "30"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  return testing::run_command(argv, {{"PATH", "/usr/bin:/bin"}, {"OMP_NUM_THREADS", "1"}, {"LOCKSTEP_NO_BLAS_WARNING", "1"}},
                              std::chrono::seconds(90));
}

nlohmann::json rank_file(const std::string& out, int rank) {
  std::ifstream in(out + "/collectives." + std::to_string(rank) + ".json");
  if (!in) return nullptr;
  return nlohmann::json::parse(in);
}

std::vector<torch::Tensor> load_tensors(const std::string& path) {
  std::vector<torch::Tensor> tensors;
  if (std::filesystem::exists(path)) torch::load(tensors, path);
  return tensors;
}

using testing::max_diff;

TEST(FabricDDP, RanksAndCollectivesOnTwoProcesses) {
  testing::TempDir dir("lockstep_fabric_collectives");
  const auto result = run_program(dir.path(), {"--case", "collectives", "--devices", "2", "--strategy", "ddp"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  for (int r = 0; r < 2; ++r) {
    const auto j = rank_file(dir.path(), r);
    ASSERT_FALSE(j.is_null()) << "rank " << r << " wrote nothing\n" << result.err;
    EXPECT_EQ(j["global_rank"], r);
    EXPECT_EQ(j["local_rank"], r);
    EXPECT_EQ(j["node_rank"], 0);
    EXPECT_EQ(j["world_size"], 2);
    EXPECT_EQ(j["is_global_zero"], r == 0);
    EXPECT_EQ(j["device"], "cpu");
    // Rank r holds [1 + r, 2 (1 + r)].
    EXPECT_EQ(j["all_reduce"]["mean"], (std::vector<double>{1.5, 3.0})) << "rank " << r;
    EXPECT_EQ(j["all_reduce"]["sum"], (std::vector<double>{3.0, 6.0})) << "rank " << r;
    EXPECT_EQ(j["all_reduce"]["max"], (std::vector<double>{2.0, 4.0})) << "rank " << r;
    EXPECT_EQ(j["all_reduce"]["min"], (std::vector<double>{1.0, 2.0})) << "rank " << r;
    EXPECT_EQ(j["input_after_all_reduce"], (std::vector<double>{1.0 + r, 2.0 * (1 + r)})) << "the input must be left as it was";
    EXPECT_EQ(j["all_reduce_double_sum"], 2.0);
    EXPECT_EQ(j["all_gather_shape"], (std::vector<int64_t>{2, 2}));
    EXPECT_EQ(j["all_gather"], (std::vector<double>{0, 0, 1, 10}));
    EXPECT_EQ(j["broadcast_tensor"], (std::vector<double>{101, 101, 101})) << "rank 1's tensor, on rank " << r;
    EXPECT_EQ(j["broadcast_string"], "written by rank 0");
  }
  EXPECT_NE(result.out.find("printed by rank 0\n"), std::string::npos) << result.out;
  EXPECT_EQ(result.out.find("printed by rank 1"), std::string::npos) << "print is for rank 0 only:\n" << result.out;
  const std::string csv = testing::slurp(dir / "logs/lockstep_logs/version_0/metrics.csv");
  EXPECT_NE(csv.find("3,"), std::string::npos) << csv;
  EXPECT_NE(csv.find("1.5"), std::string::npos) << "rank 0's log_dict value:\n" << csv;
  EXPECT_EQ(csv.find("2.5,2.5"), std::string::npos) << "rank 1 must not log:\n" << csv;
}

// 2 ranks on 8 examples each equal 1 process on the 16 they make together, step after step.
TEST(FabricDDP, TwoRanksEqualOneProcessOnTheDoubledBatch) {
  testing::TempDir dir("lockstep_fabric_parity");
  auto one = run_program(dir / "one", {"--case", "train", "--devices", "1", "--batch-size", "16"});
  ASSERT_EQ(one.exit_code, 0) << one.err;
  auto two = run_program(dir / "two", {"--case", "train", "--devices", "2", "--strategy", "ddp", "--batch-size", "8"});
  ASSERT_EQ(two.exit_code, 0) << two.err;
  const auto single = load_tensors(dir / "one/params.0.pt");
  EXPECT_LE(max_diff(single, load_tensors(dir / "two/params.0.pt")), 1e-6);
  EXPECT_EQ(max_diff(load_tensors(dir / "two/params.0.pt"), load_tensors(dir / "two/params.1.pt")), 0.0)
      << "both ranks must hold the same parameters";
}

// Accumulating 2 batches of 4 per rank (no_backward_sync on the first) equals 16 at once on one
// process; between the two, each rank's gradients are its own (nothing was reduced).
TEST(FabricDDP, NoBackwardSyncAccumulationEqualsTheWholeBatch) {
  testing::TempDir dir("lockstep_fabric_accumulate");
  auto whole = run_program(dir / "whole", {"--case", "train", "--devices", "1", "--batch-size", "16"});
  ASSERT_EQ(whole.exit_code, 0) << whole.err;
  auto parts = run_program(dir / "parts", {"--case", "train", "--devices", "2", "--strategy", "ddp", "--batch-size", "4",
                                           "--accumulate", "2"});
  ASSERT_EQ(parts.exit_code, 0) << parts.err;
  EXPECT_LE(max_diff(load_tensors(dir / "whole/params.0.pt"), load_tensors(dir / "parts/params.0.pt")), 1e-6);
  EXPECT_GT(max_diff(load_tensors(dir / "parts/accumulated.0.pt"), load_tensors(dir / "parts/accumulated.1.pt")), 1e-4)
      << "the gradients under no_backward_sync must not be reduced";
}

// A DDPStrategy subclass with its own configure_ddp, and one DDP per child (ddp_separate), train
// as the plain ddp strategy does.
TEST(FabricDDP, CustomConfigureDdpAndSeparateDdpTrainAsDdp) {
  testing::TempDir dir("lockstep_fabric_strategies");
  auto ddp = run_program(dir / "ddp", {"--case", "train", "--devices", "2", "--strategy", "ddp"});
  ASSERT_EQ(ddp.exit_code, 0) << ddp.err;
  auto custom = run_program(dir / "custom", {"--case", "train", "--devices", "2", "--custom-ddp"});
  ASSERT_EQ(custom.exit_code, 0) << custom.err;
  EXPECT_EQ(testing::slurp(dir / "custom/configured.0"), "1\n");
  EXPECT_EQ(testing::slurp(dir / "custom/configured.1"), "1\n");
  auto separate = run_program(dir / "separate", {"--case", "train", "--devices", "2", "--strategy", "ddp_separate"});
  ASSERT_EQ(separate.exit_code, 0) << separate.err;
  const auto reference = load_tensors(dir / "ddp/params.0.pt");
  EXPECT_EQ(max_diff(reference, load_tensors(dir / "custom/params.1.pt")), 0.0);
  EXPECT_LE(max_diff(reference, load_tensors(dir / "separate/params.1.pt")), 1e-6);
}

// A plain loss.backward() averages the gradients as fabric.backward(loss) does: the module's
// forward armed the reduction (PyTorch's DDP semantics). 2 ranks equal 1 process on the doubled
// batch, also when accumulating under no_backward_sync; a second backward through one forward,
// and a backward through model->forward (the module itself) are refused by name.
TEST(FabricDDP, PlainBackwardAveragesLikeFabricBackward) {
  testing::TempDir dir("lockstep_fabric_plain");
  auto one = run_program(dir / "one", {"--case", "train", "--devices", "1", "--batch-size", "16", "--backward", "plain"});
  ASSERT_EQ(one.exit_code, 0) << one.err;
  const auto single = load_tensors(dir / "one/params.0.pt");
  for (const auto& [name, flags] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"plain", {"--batch-size", "8"}}, {"accumulated", {"--batch-size", "4", "--accumulate", "2"}}}) {
    auto argv = flags;
    argv.insert(argv.end(), {"--case", "train", "--devices", "2", "--strategy", "ddp", "--backward", "plain"});
    auto two = run_program(dir / name, argv);
    ASSERT_EQ(two.exit_code, 0) << name << ": " << two.err;
    const auto rank0 = load_tensors(dir / (name + "/params.0.pt"));
    EXPECT_EQ(max_diff(rank0, load_tensors(dir / (name + "/params.1.pt"))), 0.0) << name << ": the replicas drifted";
    EXPECT_LE(max_diff(single, rank0), 1e-6) << name;
    std::cout << "[ plain backward ] " << name << ": max |diff| to one process " << max_diff(single, rank0) << "\n";
  }
  EXPECT_GT(max_diff(load_tensors(dir / "accumulated/accumulated.0.pt"), load_tensors(dir / "accumulated/accumulated.1.pt")),
            1e-4) << "the gradients under no_backward_sync must not be reduced";
  for (const auto& [how, says] : std::vector<std::pair<std::string, std::string>>{
           {"twice", "a second backward through the same forward"}, {"bypass", "instead of its wrapper"}}) {
    auto refused = run_program(dir / how, {"--case", "train", "--devices", "2", "--strategy", "ddp", "--backward", how});
    EXPECT_NE(refused.exit_code, 0) << how;
    EXPECT_NE(refused.exit_code, -1) << how << ": the job hung";
    EXPECT_NE(refused.err.find(says), std::string::npos) << how << ":\n" << refused.err;
    EXPECT_NE(refused.err.find("drift apart"), std::string::npos) << how << ":\n" << refused.err;
  }
}

// Two modules and two optimizers in one Fabric (a GAN trained in alternation, the generator's
// step through the discriminator): 2 ranks equal 1 process on the doubled batch, with
// fabric.backward and with plain backward.
TEST(FabricDDP, TwoModulesAndTwoOptimizersEqualOneProcess) {
  testing::TempDir dir("lockstep_fabric_gan");
  auto one = run_program(dir / "one", {"--case", "gan", "--devices", "1", "--batch-size", "16"});
  ASSERT_EQ(one.exit_code, 0) << one.err;
  const auto single = load_tensors(dir / "one/params.0.pt");
  ASSERT_EQ(single.size(), 8u) << "the generator's and the discriminator's parameters";
  for (const char* how : {"fabric", "plain"}) {
    auto two = run_program(dir / how, {"--case", "gan", "--devices", "2", "--strategy", "ddp", "--batch-size", "8",
                                       "--backward", how});
    ASSERT_EQ(two.exit_code, 0) << how << ": " << two.err;
    const auto rank0 = load_tensors(dir / (std::string(how) + "/params.0.pt"));
    EXPECT_EQ(max_diff(rank0, load_tensors(dir / (std::string(how) + "/params.1.pt"))), 0.0) << how << ": the replicas drifted";
    EXPECT_LE(max_diff(single, rank0), 1e-6) << how;
    std::cout << "[ two modules ] " << how << ": max |diff| to one process " << max_diff(single, rank0) << "\n";
  }
}

// Nested no_backward_sync guards restore the state they found; evaluating a BatchNorm model on
// rank 0 alone under NoGradGuard runs no collective (the other rank waits at a barrier), and the
// ranks train on as one.
TEST(FabricDDP, NestedGuardsAndEvaluationOnOneRank) {
  testing::TempDir dir("lockstep_fabric_module_calls");
  auto result = run_program(dir.path(), {"--case", "module_calls", "--devices", "2", "--strategy", "ddp"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  std::vector<nlohmann::json> ranks;
  for (int r = 0; r < 2; ++r) {
    std::ifstream in(dir / ("module_calls." + std::to_string(r) + ".json"));
    ASSERT_TRUE(in) << "rank " << r << " wrote nothing\n" << result.err;
    ranks.push_back(nlohmann::json::parse(in));
    const auto& j = ranks.back();
    EXPECT_EQ(j["sync_in_outer"], false) << r;
    EXPECT_EQ(j["sync_in_inner"], false) << r;
    EXPECT_EQ(j["sync_after_inner"], false) << r << ": the inner guard must restore the outer one's state";
    EXPECT_EQ(j["sync_in_disabled"], false) << r << ": a disabled guard changes nothing";
    EXPECT_EQ(j["sync_after_outer"], true) << r;
  }
  EXPECT_EQ(ranks[0]["evaluated"], 3);
  EXPECT_EQ(ranks[0]["first_weight_sum"], ranks[1]["first_weight_sum"]);
}

// The calls beside the loop, on 2 processes (tests/programs/fabric_program.cpp, case api).
TEST(FabricDDP, CallsBesideTheLoopOnTwoProcesses) {
  testing::TempDir dir("lockstep_fabric_api");
  auto result = run_program(dir.path(), {"--case", "api", "--devices", "2", "--strategy", "ddp"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  for (int r = 0; r < 2; ++r) {
    std::ifstream in(dir / ("api." + std::to_string(r) + ".json"));
    ASSERT_TRUE(in) << "rank " << r << " wrote nothing\n" << result.err;
    const auto j = nlohmann::json::parse(in);
    EXPECT_EQ(j["reduced_a"], 3.0) << r;
    EXPECT_EQ(j["reduced_b"], 10.0) << r;
    EXPECT_EQ(j["gathered_shapes"], (std::vector<std::vector<int64_t>>{{2, 1}, {2, 2}})) << r;
    EXPECT_EQ(j["gathered"], (std::vector<double>{0, 1})) << r;
    EXPECT_EQ(j["broadcast"], (std::vector<double>{6, 6})) << r << ": rank 1's";
    EXPECT_EQ(j["subgroup_member"], r == 1);
    EXPECT_EQ(j["group_sum"], 5.0) << r;
    if (r == 1) EXPECT_EQ(j["alone_sum"], 3.0) << "a group of rank 1 alone sums its own value";
    // Each rank's slice r is weighted [r-th row] on both ranks: the gradient is twice that row.
    EXPECT_EQ(j["gather_grad"], (r == 0 ? std::vector<double>{2, 4} : std::vector<double>{6, 8})) << r;
    EXPECT_EQ(j["first"], "prepared by rank 0") << r << ": rank 0 must have run first";
    EXPECT_EQ(j["init_device"], "cpu");
    EXPECT_EQ(j["init_dtype"], "Float");
    EXPECT_EQ(j["filtered_keys"], (std::vector<std::string>{"fc1.weight", "fc1.bias"})) << r;
    EXPECT_EQ(j["strict_error"], true) << r << ": a strict load names the missing key";
    EXPECT_EQ(j["non_strict_fc1_equal"], true) << r;
    EXPECT_EQ(j["non_strict_left_value"], -1) << r << ": a key the checkpoint lacks is left as it was";
    EXPECT_EQ(j["raw_equal"], true) << r;
    EXPECT_EQ(j["callback_calls"], (std::vector<int64_t>{7})) << r;
    EXPECT_EQ(j["torch_data_batches"], 4) << r << ": 64 examples, 32 per rank, batches of 8";
    EXPECT_EQ(j["whole_batches"], 8) << r << ": without the distributed sampler each rank reads all 64";
    EXPECT_EQ(j["to_device"], "cpu");
    EXPECT_EQ(j["accelerator"], "cpu");
  }
}

TEST(FabricDDP, SaveOnTwoRanksWritesOneCheckpointOfRankZero) {
  testing::TempDir dir("lockstep_fabric_save");
  auto result = run_program(dir / "run", {"--case", "train", "--devices", "2", "--save", dir / "run/fabric.ckpt"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const auto ckpt = checkpoint::CheckpointIO().load(dir / "run/fabric.ckpt");
  std::vector<torch::Tensor> saved;
  for (const auto& entry : ckpt.at("state_dict").toGenericDict()) saved.push_back(entry.value().toTensor());
  EXPECT_EQ(max_diff(saved, load_tensors(dir / "run/params.0.pt")), 0.0);
  EXPECT_EQ(ckpt.at("step").toInt(), 4);
}

// A rank that throws inside launch(fn) takes the job down, whichever rank it is, long before
// the collectives' timeout (30 s here).
TEST(FabricDDP, ARankThatFailsEndsTheJob) {
  testing::TempDir dir("lockstep_fabric_fail");
  for (const char* rank : {"0", "1"}) {
    const auto started = std::chrono::steady_clock::now();
    const auto result = run_program(dir / "run", {"--case", "collectives", "--devices", "2", "--fail-on-rank", rank});
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    EXPECT_NE(result.exit_code, 0) << "rank " << rank;
    EXPECT_NE(result.exit_code, -1) << "rank " << rank << ": the job hung";
    EXPECT_LT(seconds, 20.0) << "rank " << rank;
    EXPECT_NE(result.err.find(std::string("rank ") + rank + " fails on purpose"), std::string::npos) << result.err;
  }
}

TEST(FabricDDP, BadInputExitsTwoWithTheFix) {
  testing::TempDir dir("lockstep_fabric_bad");
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--strategy", "deepspeed"}, "Use --strategy ddp"},
      {{"--devices", "two"}, "--devices 2"},
      {{"--precision", "8"}, "Use 32-true"},
      {{"--strategy", "single_device", "--devices", "2"}, "Use --strategy ddp, or --devices 1"},
      {{"--max-epochs", "3"}, "unknown flag --max-epochs"},
  };
  for (const auto& [flags, fix] : cases) {
    auto argv = flags;
    argv.insert(argv.begin(), {"--case", "train"});
    const auto result = run_program(dir / "run", argv);
    EXPECT_EQ(result.exit_code, 2) << flags[0] << ": " << result.err;
    EXPECT_NE(result.err.find(fix), std::string::npos) << result.err;
    EXPECT_EQ(result.err.find("Exception raised from"), std::string::npos) << "no backtrace:\n" << result.err;
  }
}

}  // namespace
}  // namespace lockstep
