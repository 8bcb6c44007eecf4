// examples/fabric_loop, run as a user runs it, against examples/fashion_mnist: the hand-written
// Fabric loop and the Trainer end with the same parameters on the same settings (SGD,
// --no-shuffle, the same seed and steps), and 2 ranks equal 1 process on the doubled batch.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <torch/torch.h>

#include <lockstep/checkpoint/checkpoint_io.h>

#include "../support/command.h"
#include "../support/paths.h"
#include "../support/temp_dir.h"
#include "../support/written_parameters.h"

namespace lockstep {
namespace {

using testing::run_command;

const std::map<std::string, std::string> kEnv{
    {"PATH", "/usr/bin:/bin"}, {"HOME", "/tmp"}, {"OMP_NUM_THREADS", "1"}, {"LOCKSTEP_NO_BLAS_WARNING", "1"}};

// Parameters of a checkpoint, by name without fashion_mnist's "net." prefix.
std::map<std::string, torch::Tensor> parameters_in(const std::string& path) {
  std::map<std::string, torch::Tensor> params;
  if (!std::filesystem::exists(path)) {
    ADD_FAILURE() << "no checkpoint at " << path;
    return params;
  }
  for (const auto& entry : checkpoint::CheckpointIO().load(path).at("state_dict").toGenericDict()) {
    std::string name = entry.key().toStringRef();
    if (name.rfind("net.", 0) == 0) name = name.substr(4);
    params[name] = entry.value().toTensor();
  }
  return params;
}

std::map<std::string, torch::Tensor> fabric_loop(const std::string& root, const std::vector<std::string>& extra) {
  std::vector<std::string> argv{std::string(LOCKSTEP_BIN_DIR) + "/fabric_loop", "--model", "mlp", "--optimizer", "sgd",
                                "--lr", "0.05", "--no-shuffle", "--seed", "7", "--timeout", "60",
                                "--default-root-dir", root};
  argv.insert(argv.end(), extra.begin(), extra.end());
  const auto result = run_command(argv, kEnv, std::chrono::seconds(120));
  EXPECT_EQ(result.exit_code, 0) << result.err << result.out;
  EXPECT_NE(result.out.find("fabric_loop: val_acc"), std::string::npos) << result.out;
  return parameters_in(root + "/checkpoints/last.ckpt");
}

std::map<std::string, torch::Tensor> fashion_mnist(const std::string& root, const std::vector<std::string>& extra) {
  std::vector<std::string> argv{std::string(LOCKSTEP_BIN_DIR) + "/fashion_mnist", "--model", "mlp", "--optimizer", "sgd",
                                "--lr", "0.05", "--no-shuffle", "--seed", "7", "--timeout", "60",
                                "--default-root-dir", root, "--enable-progress-bar", "false",
                                "--num-sanity-val-steps", "0", "--limit-val-batches", "1"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  const auto result = run_command(argv, kEnv, std::chrono::seconds(120));
  EXPECT_EQ(result.exit_code, 0) << result.err << result.out;
  // The newest checkpoint ModelCheckpoint wrote (epoch=E-step=S.ckpt; last.ckpt when it saves last).
  std::string newest;
  for (const auto& entry : std::filesystem::directory_iterator(root + "/lockstep_logs/version_0/checkpoints")) {
    if (newest.empty() || entry.path().filename() == "last.ckpt") newest = entry.path().string();
  }
  return parameters_in(newest);
}

using testing::max_diff;

TEST(FabricLoop, EqualsTheTrainerOnTwoProcesses) {
  testing::TempDir dir("lockstep_fabric_loop_trainer");
  const std::vector<std::string> flags{"--max-steps", "20", "--devices", "2", "--strategy", "ddp", "--batch-size", "32"};
  const auto fabric = fabric_loop(dir / "fabric", flags);
  const auto trainer = fashion_mnist(dir / "trainer", flags);
  const double diff = max_diff(fabric, trainer);
  std::cout << "fabric_loop vs fashion_mnist, 2 processes, 20 steps: max |difference| " << diff << "\n";
  EXPECT_LE(diff, 1e-6);
  EXPECT_GT(max_diff(fabric, fabric_loop(dir / "other", {"--max-steps", "5", "--devices", "1", "--momentum", "0.5"})),
            1e-3) << "other settings must give other weights";
}

// no_backward_sync and clip_gradients in the loop do what the Trainer's flags do.
TEST(FabricLoop, EqualsTheTrainerWithAccumulationAndClipping) {
  testing::TempDir dir("lockstep_fabric_loop_accumulate");
  const std::vector<std::string> flags{"--max-steps", "6", "--devices", "2", "--strategy", "ddp", "--batch-size", "16",
                                       "--accumulate-grad-batches", "3", "--gradient-clip-val", "0.5"};
  const double diff = max_diff(fabric_loop(dir / "fabric", flags), fashion_mnist(dir / "trainer", flags));
  std::cout << "fabric_loop vs fashion_mnist, accumulating 3, clipping 0.5: max |difference| " << diff << "\n";
  EXPECT_LE(diff, 1e-6);
}

TEST(FabricLoop, TwoRanksEqualOneProcessOnTheDoubledBatch) {
  testing::TempDir dir("lockstep_fabric_loop_parity");
  const auto one = fabric_loop(dir / "one", {"--max-steps", "10", "--devices", "1", "--batch-size", "64"});
  const auto two = fabric_loop(dir / "two", {"--max-steps", "10", "--devices", "2", "--strategy", "ddp", "--batch-size", "32"});
  const double diff = max_diff(one, two);
  std::cout << "fabric_loop, 2 ranks x 32 vs 1 process x 64, 10 steps: max |difference| " << diff << "\n";
  EXPECT_LE(diff, 1e-6);
}

TEST(FabricLoop, BadInputExitsTwoWithOneMessage) {
  testing::TempDir dir("lockstep_fabric_loop_bad");
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--strategy", "dp"}, "Use --strategy ddp"},
      {{"--devices", "0"}, "at least 1"},
      {{"--precision", "16-mixed"}, "--precision bf16-mixed"},
      {{"--optimizer", "lbfgs"}, "--optimizer"},
      {{"--num-nodes", "2"}, "lockstep launch --nnodes 2"},
  };
  for (const auto& [flags, fix] : cases) {
    std::vector<std::string> argv{std::string(LOCKSTEP_BIN_DIR) + "/fabric_loop", "--default-root-dir", dir.path(),
                                  "--max-steps", "1"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    const auto result = run_command(argv, kEnv, std::chrono::seconds(60));
    EXPECT_EQ(result.exit_code, 2) << flags[0] << ": " << result.err;
    EXPECT_NE(result.err.find(fix), std::string::npos) << result.err;
    EXPECT_NE(result.err.find("fabric_loop: error:"), std::string::npos) << result.err;
    EXPECT_EQ(result.err.find("Exception raised from"), std::string::npos) << result.err;
    EXPECT_FALSE(std::filesystem::exists(dir / "checkpoints")) << "nothing written on bad input";
  }
}

}  // namespace
}  // namespace lockstep
