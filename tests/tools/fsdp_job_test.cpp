// --strategy fsdp run as a user runs it: examples/fashion_mnist (the Trainer) and
// examples/fabric_loop (Fabric) with each sharding end where DDP ends after 50 Adam steps, also
// with accumulation and clipping; their checkpoints hold whole tensors that Python reads, and a
// run resumed from one (by FSDP, or by one process) goes on from where it was.
#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <torch/torch.h>

#include <lockstep/checkpoint/checkpoint_io.h>
#include <lockstep/checkpoint/dcp_checkpoint.h>
#include <lockstep/checkpoint/sharded_checkpoint.h>

#include "../support/command.h"
#include "../support/dcp_python.h"
#include "../support/paths.h"
#include "../support/temp_dir.h"
#include "../support/written_parameters.h"

namespace lockstep {
namespace fsdp_job_test {
namespace {

using testing::max_diff;
using testing::run_command;

const std::map<std::string, std::string> kEnv{
    {"PATH", "/usr/bin:/bin"}, {"HOME", "/tmp"}, {"OMP_NUM_THREADS", "1"}, {"LOCKSTEP_NO_BLAS_WARNING", "1"}};
const std::vector<std::string> kShardings{"FULL_SHARD", "SHARD_GRAD_OP", "SHARD_OPTIMIZER_STATE"};

// The parameters and the optimizer's per-element state (exp_avg, exp_avg_sq) of a checkpoint, by
// name without the Trainer's "net." prefix ("state/3/exp_avg" for the state). A sharded
// checkpoint directory is read whole.
std::map<std::string, torch::Tensor> tensors_in(const std::string& path, const std::string& optimizer_key) {
  std::map<std::string, torch::Tensor> out;
  if (!std::filesystem::exists(path)) {
    ADD_FAILURE() << "no checkpoint at " << path;
    return out;
  }
  const auto ckpt = checkpoint::is_sharded_checkpoint(path)
                        ? checkpoint::to_full_checkpoint(checkpoint::load_sharded(path))
                        : checkpoint::is_dcp_checkpoint(path) ? checkpoint::to_full_checkpoint(checkpoint::load_dcp(path))
                                                              : checkpoint::CheckpointIO().load(path);
  for (const auto& entry : ckpt.at("state_dict").toGenericDict()) {
    std::string name = entry.key().toStringRef();
    if (name.rfind("net.", 0) == 0) name = name.substr(4);
    out[name] = entry.value().toTensor();
  }
  auto optimizer = ckpt.at(optimizer_key);
  if (optimizer.isList()) optimizer = optimizer.toListRef().at(0);
  for (const auto& entry : optimizer.toGenericDict().at("state").toGenericDict()) {
    for (const auto& item : entry.value().toGenericDict()) {
      if (item.key().toStringRef() == "step") continue;
      out["state/" + std::to_string(entry.key().toInt()) + "/" + item.key().toStringRef()] = item.value().toTensor();
    }
  }
  return out;
}

std::string last_checkpoint(const std::string& root) {
  std::string newest;
  for (int v = 0; std::filesystem::exists(root + "/lockstep_logs/version_" + std::to_string(v)); ++v) {
    newest = root + "/lockstep_logs/version_" + std::to_string(v) + "/checkpoints/last.ckpt";
  }
  return newest;
}

// examples/fashion_mnist into `root` (Adam unless `optimizer` says otherwise); returns its last
// checkpoint's path.
std::string fashion_mnist(const std::string& root, const std::vector<std::string>& extra,
                          const std::string& optimizer = "adam") {
  std::vector<std::string> argv{std::string(LOCKSTEP_BIN_DIR) + "/fashion_mnist", "--optimizer", optimizer, "--lr", "0.001",
                                "--no-shuffle", "--seed", "7", "--timeout", "60", "--default-root-dir", root,
                                "--enable-progress-bar", "false", "--num-sanity-val-steps", "0",
                                "--limit-val-batches", "1"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  const auto result = run_command(argv, kEnv, std::chrono::seconds(120));
  EXPECT_EQ(result.exit_code, 0) << result.err << result.out;
  return last_checkpoint(root);
}

// On 2 FSDP ranks saving with --fsdp-state-dict-type `type`: a run of `epochs` epochs, and one of 1
// epoch resumed from its last checkpoint to `epochs`, end bit for bit alike (parameters and Adam's
// moments). Returns the uninterrupted run's last checkpoint.
std::string expect_resume_bit_for_bit(const testing::TempDir& dir, const std::string& type, const std::string& epochs) {
  const std::vector<std::string> flags{"--model", "mlp", "--batch-size", "32", "--devices", "2", "--strategy", "fsdp",
                                       "--fsdp-state-dict-type", type, "--limit-train-batches", "5"};
  auto whole = flags;
  whole.insert(whole.end(), {"--max-epochs", epochs});
  const auto uninterrupted_path = fashion_mnist(dir / "whole", whole);
  const auto uninterrupted = tensors_in(uninterrupted_path, "optimizer_states");
  auto half = flags;
  half.insert(half.end(), {"--max-epochs", "1"});
  const auto halfway = tensors_in(fashion_mnist(dir / "parts", half), "optimizer_states");
  auto rest = flags;
  rest.insert(rest.end(), {"--max-epochs", epochs, "--ckpt-path", "last"});
  const auto resumed = tensors_in(fashion_mnist(dir / "parts", rest), "optimizer_states");
  EXPECT_GT(max_diff(halfway, resumed), 1e-4) << "the resumed run must have trained on";
  EXPECT_EQ(max_diff(uninterrupted, resumed), 0.0);
  return uninterrupted_path;
}

class FsdpTrainer : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

// Each sharding, through the Trainer, ends within 1e-6 of DDP: parameters and Adam's moments.
TEST_P(FsdpTrainer, EachShardingEqualsDdpAfterFiftyAdamSteps) {
  const auto [model, ranks] = GetParam();
  testing::TempDir dir("lockstep_fsdp_trainer");
  const std::vector<std::string> flags{"--model", model, "--max-steps", "50", "--devices", std::to_string(ranks),
                                       "--batch-size", std::to_string(64 / ranks)};
  auto ddp = flags;
  ddp.insert(ddp.end(), {"--strategy", "ddp"});
  const auto expected = tensors_in(fashion_mnist(dir / "ddp", ddp), "optimizer_states");
  for (const auto& sharding : kShardings) {
    auto fsdp = flags;
    fsdp.insert(fsdp.end(), {"--strategy", "fsdp", "--fsdp-sharding", sharding});
    const double diff = max_diff(tensors_in(fashion_mnist(dir / sharding, fsdp), "optimizer_states"), expected);
    std::cout << model << ", " << ranks << " ranks, " << sharding << " vs DDP: max |difference| " << diff << "\n";
    EXPECT_LE(diff, 1e-6) << sharding;
  }
}

INSTANTIATE_TEST_SUITE_P(Jobs, FsdpTrainer,
                         // The CNN on 2 ranks only: 4 ranks of it took a minute of the suite on 2 cores,
                         // and the MLP covers 4 ranks' layout.
                         ::testing::Values(std::make_tuple("mlp", 2), std::make_tuple("mlp", 4),
                                           std::make_tuple("cnn", 2)),
                         [](const ::testing::TestParamInfo<std::tuple<std::string, int>>& info) {
                           return std::get<0>(info.param) + "_" + std::to_string(std::get<1>(info.param)) + "ranks";
                         });

// Accumulated batches and a clipped norm (over every rank's shard) as DDP does them.
TEST(FsdpTrainerSteps, AccumulationAndClippingEqualDdp) {
  testing::TempDir dir("lockstep_fsdp_accumulate");
  const std::vector<std::string> flags{"--model", "mlp", "--max-steps", "10", "--devices", "2", "--batch-size", "16",
                                       "--accumulate-grad-batches", "3", "--gradient-clip-val", "0.05"};
  auto ddp = flags;
  ddp.insert(ddp.end(), {"--strategy", "ddp"});
  auto fsdp = flags;
  fsdp.insert(fsdp.end(), {"--strategy", "fsdp"});
  const double diff = max_diff(tensors_in(fashion_mnist(dir / "fsdp", fsdp), "optimizer_states"),
                               tensors_in(fashion_mnist(dir / "ddp", ddp), "optimizer_states"));
  std::cout << "FULL_SHARD vs DDP, accumulating 3, clipping 0.05: max |difference| " << diff << "\n";
  EXPECT_LE(diff, 1e-6);
}

// HYBRID_SHARD on 4 ranks in 2 groups of 2, accumulating and clipping, ends where DDP ends; its
// sharded checkpoint (ranks 0 and 2 write the same pieces) reads back whole. SGD: the two-level sum
// ((x0 + x1) + (x2 + x3)) rounds differently from DDP's ((x0 + x1) + x2) + x3, and Adam's division
// by the root of tiny second moments turns such last-bit differences into 1e-4 (LibTorch 2.15).
TEST(FsdpTrainerSteps, HybridShardInGroupsOfTwoEqualsDdp) {
  testing::TempDir dir("lockstep_fsdp_hybrid");
  const std::vector<std::string> flags{"--model", "mlp", "--max-steps", "20", "--devices", "4", "--batch-size", "16",
                                       "--accumulate-grad-batches", "2", "--gradient-clip-val", "0.05"};
  auto ddp = flags;
  ddp.insert(ddp.end(), {"--strategy", "ddp"});
  auto hybrid = flags;
  hybrid.insert(hybrid.end(), {"--strategy", "fsdp", "--fsdp-sharding", "HYBRID_SHARD", "--fsdp-hybrid-shard-size",
                               "2", "--fsdp-state-dict-type", "sharded"});
  const auto saved = fashion_mnist(dir / "hybrid", hybrid, "sgd");
  EXPECT_TRUE(checkpoint::is_sharded_checkpoint(saved)) << saved;
  const double diff = max_diff(tensors_in(saved, "optimizer_states"),
                               tensors_in(fashion_mnist(dir / "ddp", ddp, "sgd"), "optimizer_states"));
  std::cout << "HYBRID_SHARD (2 groups of 2) vs DDP, accumulating 2, clipping 0.05: max |difference| " << diff << "\n";
  EXPECT_LE(diff, 1e-6);
}

// The checkpoint holds whole tensors: FSDP resumes from it bit for bit, one process resumes from
// it, and Python's torch.load reads it with the model's shapes.
TEST(FsdpTrainerSteps, TheCheckpointResumesUnderFsdpAndInOneProcess) {
  testing::TempDir dir("lockstep_fsdp_resume");
  const std::vector<std::string> flags{"--model", "mlp", "--batch-size", "32", "--devices", "2", "--strategy", "fsdp",
                                       "--limit-train-batches", "5"};
  auto whole = flags;
  whole.insert(whole.end(), {"--max-epochs", "3"});
  const auto uninterrupted = tensors_in(fashion_mnist(dir / "whole", whole), "optimizer_states");
  auto half = flags;
  half.insert(half.end(), {"--max-epochs", "1"});
  const auto halfway_path = fashion_mnist(dir / "parts", half);
  const auto halfway = tensors_in(halfway_path, "optimizer_states");
  auto rest = flags;
  rest.insert(rest.end(), {"--max-epochs", "3", "--ckpt-path", "last"});
  const auto resumed = tensors_in(fashion_mnist(dir / "parts", rest), "optimizer_states");
  EXPECT_GT(max_diff(halfway, resumed), 1e-4) << "the resumed run must have trained on";
  EXPECT_EQ(max_diff(uninterrupted, resumed), 0.0);

  const auto one = fashion_mnist(dir / "one", {"--model", "mlp", "--batch-size", "64", "--devices", "1",
                                               "--limit-train-batches", "5", "--max-epochs", "2", "--ckpt-path",
                                               halfway_path});
  EXPECT_GT(max_diff(halfway, tensors_in(one, "optimizer_states")), 1e-4) << "one process must have trained on";

  const auto python = run_command(
      {testing::test_python(), "-c",
       "import sys, torch\n"
       "c = torch.load(sys.argv[1])\n"
       "print(tuple(c['state_dict']['net.fc1.weight'].shape),"
       " tuple(c['optimizer_states'][0]['state'][0]['exp_avg'].shape))\n",
       halfway_path},
      kEnv, std::chrono::seconds(60));
  EXPECT_EQ(python.exit_code, 0) << python.err;
  EXPECT_NE(python.out.find("(512, 784) (512, 784)"), std::string::npos) << python.out;
}

// --fsdp-state-dict-type sharded: each rank writes its pieces into a directory; resuming from it
// on the same world size is bit for bit the uninterrupted run (parameters and Adam's moments).
TEST(FsdpShardedCheckpoint, ResumesOnTwoRanksBitForBit) {
  testing::TempDir dir("lockstep_fsdp_sharded_resume");
  const auto uninterrupted_path = expect_resume_bit_for_bit(dir, "sharded", "3");
  EXPECT_TRUE(checkpoint::is_sharded_checkpoint(uninterrupted_path)) << uninterrupted_path;
  EXPECT_TRUE(std::filesystem::exists(uninterrupted_path + "/rank_1.ckpt"));
  // ModelCheckpoint keeps one top-k checkpoint: the directories it replaced are gone.
  size_t kept = 0;
  for (const auto& entry : std::filesystem::directory_iterator(std::filesystem::path(uninterrupted_path).parent_path())) {
    kept += entry.path().filename() != "last.ckpt";
  }
  EXPECT_EQ(kept, 1u);
}

// --fsdp-state-dict-type dcp: the Trainer's checkpoints are DCP folders; resuming from one on 2
// ranks is bit for bit the uninterrupted run, and Python's dcp_to_torch_save (which unflattens by
// the folder's planner_data) reads the whole checkpoint, the parameters equal to Lockstep's.
TEST(FsdpDcpCheckpoint, ResumesOnTwoRanksBitForBitAndPythonReadsIt) {
  testing::TempDir dir("lockstep_fsdp_dcp_resume");
  const auto uninterrupted_path = expect_resume_bit_for_bit(dir, "dcp", "2");
  ASSERT_TRUE(checkpoint::is_dcp_checkpoint(uninterrupted_path)) << uninterrupted_path;
  EXPECT_TRUE(std::filesystem::exists(uninterrupted_path + "/__1_0.distcp"));
  const auto uninterrupted = tensors_in(uninterrupted_path, "optimizer_states");

  LOCKSTEP_REQUIRE_DCP_PYTHON(python);
  const auto converted = run_command(
      {python, "-c",
       "import sys, torch\n"
       "from torch.distributed.checkpoint.format_utils import dcp_to_torch_save\n"
       "dcp_to_torch_save(sys.argv[1], sys.argv[2])\n"
       "c = torch.load(sys.argv[2], weights_only=False)\n"
       "print(c['epoch'], sorted(c['optim']['state'])[0], tuple(c['model']['net.fc1.weight'].shape))\n",
       uninterrupted_path, dir / "whole.pt"},
      kEnv, std::chrono::seconds(120));
  ASSERT_EQ(converted.exit_code, 0) << converted.err;
  EXPECT_EQ(converted.out.substr(0, 2), "1 ") << converted.out;
  const auto in_python = checkpoint::CheckpointIO().load(dir / "whole.pt").at("model").toGenericDict();
  for (const auto& entry : in_python) {
    const auto name = entry.key().toStringRef().substr(4);  // without "net."
    EXPECT_TRUE(entry.value().toTensor().equal(uninterrupted.at(name))) << name;
  }
}

// The directory of 2 ranks resumes on 4 ranks (each reads its pieces of the new layout) and in one
// process (read whole): one more epoch on the same global batch ends where 2 ranks end.
TEST(FsdpShardedCheckpoint, ResumesOnFourRanksAndInOneProcess) {
  testing::TempDir dir("lockstep_fsdp_sharded_reshard");
  const std::vector<std::string> common{"--model", "mlp", "--limit-train-batches", "5", "--fsdp-state-dict-type",
                                        "sharded", "--strategy", "fsdp"};
  const auto run = [&](const std::string& root, std::vector<std::string> flags) {
    flags.insert(flags.end(), common.begin(), common.end());
    return fashion_mnist(root, flags);
  };
  const auto saved = run(dir / "two", {"--batch-size", "32", "--devices", "2", "--max-epochs", "1"});
  const auto halfway = tensors_in(saved, "optimizer_states");
  const auto on_two = tensors_in(
      run(dir / "two", {"--batch-size", "32", "--devices", "2", "--max-epochs", "2", "--ckpt-path", "last"}),
      "optimizer_states");
  const auto on_four = tensors_in(
      run(dir / "four", {"--batch-size", "16", "--devices", "4", "--max-epochs", "2", "--ckpt-path", saved}),
      "optimizer_states");
  const auto one = fashion_mnist(dir / "one", {"--model", "mlp", "--limit-train-batches", "5", "--batch-size", "64",
                                               "--devices", "1", "--max-epochs", "2", "--ckpt-path", saved});
  const auto in_one = tensors_in(one, "optimizer_states");
  EXPECT_FALSE(checkpoint::is_sharded_checkpoint(one)) << "one process writes whole files";
  EXPECT_GT(max_diff(halfway, on_two), 1e-4) << "the resumed run must have trained on";
  const double four = max_diff(on_four, on_two);
  const double single = max_diff(in_one, on_two);
  std::cout << "resumed from 2 ranks' sharded checkpoint, one epoch on: 4 ranks vs 2: " << four
            << ", one process vs 2: " << single << "\n";
  EXPECT_LE(four, 1e-6);
  EXPECT_LE(single, 1e-6);
}

// A sharded run resumes from a full file as a full run does: the same numbers, bit for bit.
TEST(FsdpShardedCheckpoint, ResumesFromAFullFileAsAFullRunDoes) {
  testing::TempDir dir("lockstep_fsdp_sharded_from_full");
  const std::vector<std::string> flags{"--model", "mlp", "--batch-size", "32", "--devices", "2", "--strategy", "fsdp",
                                       "--limit-train-batches", "3"};
  auto first = flags;
  first.insert(first.end(), {"--max-epochs", "1"});
  const auto full = fashion_mnist(dir / "first", first);
  ASSERT_FALSE(checkpoint::is_sharded_checkpoint(full));
  const auto resume = [&](const std::string& root, const std::string& type) {
    auto rest = flags;
    rest.insert(rest.end(), {"--max-epochs", "2", "--ckpt-path", full, "--fsdp-state-dict-type", type});
    return tensors_in(fashion_mnist(root, rest), "optimizer_states");
  };
  const auto sharded = resume(dir / "sharded", "sharded");
  EXPECT_GT(max_diff(tensors_in(full, "optimizer_states"), sharded), 1e-4) << "the resumed run must have trained on";
  EXPECT_EQ(max_diff(resume(dir / "full", "full"), sharded), 0.0);
}

// A damaged rank file stops the resumed run with exit code 2, naming the file.
TEST(FsdpShardedCheckpoint, ADamagedRankFileExitsTwoNamingIt) {
  testing::TempDir dir("lockstep_fsdp_sharded_damaged");
  const std::vector<std::string> flags{"--model", "mlp", "--batch-size", "32", "--devices", "2", "--strategy", "fsdp",
                                       "--fsdp-state-dict-type", "sharded", "--limit-train-batches", "2",
                                       "--max-epochs", "1"};
  const auto saved = fashion_mnist(dir / "saved", flags);
  std::filesystem::resize_file(saved + "/rank_1.ckpt", 1000);
  std::vector<std::string> argv{std::string(LOCKSTEP_BIN_DIR) + "/fashion_mnist", "--timeout", "30",
                                "--default-root-dir", dir / "resumed", "--enable-progress-bar", "false",
                                "--max-epochs", "2", "--ckpt-path", saved};
  argv.insert(argv.end(), flags.begin(), flags.end() - 2);
  const auto result = run_command(argv, kEnv, std::chrono::seconds(60));
  EXPECT_EQ(result.exit_code, 2) << result.err;
  EXPECT_NE(result.err.find(saved + "/rank_1.ckpt' is damaged"), std::string::npos) << result.err;
  // One process reads every rank file: the same message.
  const auto one = run_command({std::string(LOCKSTEP_BIN_DIR) + "/fashion_mnist", "--model", "mlp",
                                "--default-root-dir", dir / "one", "--max-epochs", "2", "--ckpt-path", saved},
                               kEnv, std::chrono::seconds(60));
  EXPECT_EQ(one.exit_code, 2) << one.err;
  EXPECT_NE(one.err.find("rank_1.ckpt' is damaged"), std::string::npos) << one.err;
}

// examples/fabric_loop: the same loop under --strategy fsdp ends where it ends under ddp.
TEST(FsdpFabric, TheLoopEqualsDdpWithAccumulationAndClipping) {
  testing::TempDir dir("lockstep_fsdp_fabric");
  const auto run = [&](const std::string& root, const std::string& strategy) {
    std::vector<std::string> argv{std::string(LOCKSTEP_BIN_DIR) + "/fabric_loop", "--model", "mlp", "--optimizer",
                                  "adam", "--lr", "0.001", "--no-shuffle", "--seed", "7", "--timeout", "60",
                                  "--default-root-dir", root, "--max-steps", "20", "--devices", "2",
                                  "--batch-size", "16", "--accumulate-grad-batches", "2", "--gradient-clip-val",
                                  "0.05", "--strategy", strategy};
    const auto result = run_command(argv, kEnv, std::chrono::seconds(120));
    EXPECT_EQ(result.exit_code, 0) << result.err << result.out;
    return tensors_in(root + "/checkpoints/last.ckpt", "optimizer");
  };
  const double diff = max_diff(run(dir / "fsdp", "fsdp"), run(dir / "ddp", "ddp"));
  std::cout << "fabric_loop, FULL_SHARD vs DDP, 20 steps: max |difference| " << diff << "\n";
  EXPECT_LE(diff, 1e-6);
}

}  // namespace
}  // namespace fsdp_job_test
}  // namespace lockstep
