// Checkpoints across the Lightning border, both ways, on the Fashion-MNIST job of
// bench/trainer/lightning_fashion_mnist.py and examples/fashion_mnist (same model, data order,
// Adam and schedule; 1 process, 5 batches of 64 an epoch, 1 validation batch):
// - Lightning 2.6 trains epoch 0 and saves its last.ckpt; Lockstep's fashion_mnist resumes from that
//   .ckpt (--ckpt-path), and its losses over epochs 1 and 2 follow Lightning's own resumed run from
//   the same file within kTolerance;
// - Lockstep trains epoch 0; tools/python/lockstep_to_lightning.py turns its last.ckpt into a
//   Lightning one, and Lightning's resumed losses follow Lockstep's own resumed run as closely.
// The Lightning side runs in the Python of .venv-libtorch2 (torch 2.15, pytorch-lightning 2.6) on
// both LibTorch lines; without it, or without pytorch_lightning in it, the tests skip saying which.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "../support/command.h"
#include "../support/paths.h"
#include "../support/temp_dir.h"

namespace lockstep {
namespace lightning_checkpoint_test {

using testing::run_command;

// Largest |loss difference| allowed per step. Measured 2026-12-05, the largest over the 10
// resumed steps: 1.2e-7 to 2.4e-7 with LibTorch 1.13, 1.2e-7 (Lightning's file) and 3.6e-7 (the
// recipe's) with LibTorch 2.15, against torch 2.15: one to three float32 ulps of losses near 1.
constexpr double kTolerance = 1e-5;

struct Step {
  int64_t epoch;
  double lr;  // NaN where the side does not log it
  double loss;
};

std::string lightning_python() { return std::string(LOCKSTEP_SOURCE_DIR) + "/.venv-libtorch2/bin/python"; }

// Why the Lightning side cannot run here, or "".
std::string lightning_missing() {
  if (!std::filesystem::exists(lightning_python())) {
    return ".venv-libtorch2/bin/python is missing (LOCKSTEP_LIBTORCH=pypi scripts/setup installs it)";
  }
  const auto probe = run_command({lightning_python(), "-c", "import pytorch_lightning"}, {{"HOME", "/tmp"}},
                                 std::chrono::seconds(60));
  return probe.exit_code == 0 ? "" : ".venv-libtorch2's Python lacks pytorch_lightning: " + probe.err.substr(0, 200);
}

const std::vector<std::string> kJob{"--devices", "1", "--limit-train-batches", "5", "--limit-val-batches", "1"};

std::map<std::string, std::string> quiet_env(const std::string& home) {
  return {{"PATH", "/usr/bin:/bin"}, {"HOME", home}, {"OMP_NUM_THREADS", "1"}, {"LOCKSTEP_NO_BLAS_WARNING", "1"},
          {"PYTHONWARNINGS", "ignore"}};
}

// Runs Lightning's side of the job in `root`: its per-step losses.
std::vector<Step> run_lightning(const std::string& root, const std::vector<std::string>& flags) {
  std::filesystem::create_directories(root);
  const std::string losses = root + "/losses.txt";
  std::vector<std::string> argv{lightning_python(), std::string(LOCKSTEP_SOURCE_DIR) + "/bench/trainer/lightning_fashion_mnist.py",
                                "--default-root-dir", root, "--losses-file", losses};
  argv.insert(argv.end(), kJob.begin(), kJob.end());
  argv.insert(argv.end(), flags.begin(), flags.end());
  const auto result = run_command(argv, quiet_env(root), std::chrono::seconds(100));
  EXPECT_EQ(result.exit_code, 0) << result.err;
  std::vector<Step> steps;
  std::istringstream lines(testing::slurp(losses));
  for (std::string epoch, step, lr, loss; lines >> epoch >> step >> lr >> loss;) {
    steps.push_back({std::stoll(epoch), std::strtod(lr.c_str(), nullptr), std::strtod(loss.c_str(), nullptr)});
  }
  return steps;
}

struct LockstepRun {
  testing::CommandResult command;
  std::vector<Step> steps;  // of the newest run folder's metrics.csv
};

LockstepRun run_lockstep(const std::string& root, const std::vector<std::string>& flags) {
  std::vector<std::string> argv{std::string(LOCKSTEP_BIN_DIR) + "/fashion_mnist", "--seed", "0", "--log-every-n-steps",
                                "1", "--enable-progress-bar", "false", "--timeout", "60", "--default-root-dir", root};
  argv.insert(argv.end(), kJob.begin(), kJob.end());
  argv.insert(argv.end(), flags.begin(), flags.end());
  LockstepRun run{run_command(argv, quiet_env("/tmp"), std::chrono::seconds(90)), {}};
  std::string newest;
  for (int v = 0; std::filesystem::exists(root + "/lockstep_logs/version_" + std::to_string(v)); ++v) {
    newest = root + "/lockstep_logs/version_" + std::to_string(v) + "/metrics.csv";
  }
  std::istringstream lines(newest.empty() ? "" : testing::slurp(newest));
  std::string line;
  std::getline(lines, line);  // step,epoch,train_loss,val_acc,val_loss
  while (std::getline(lines, line)) {
    std::vector<std::string> cells;
    std::istringstream row(line);
    for (std::string cell; std::getline(row, cell, ',');) cells.push_back(cell);
    if (cells.size() >= 3 && !cells[2].empty()) run.steps.push_back({std::stoll(cells[1]), NAN, std::stod(cells[2])});
  }
  return run;
}

// Both sides trained epochs 1 and 2 (5 steps each, the second at half the learning rate) from
// the same checkpoint, with losses within kTolerance step by step.
void expect_same_losses(const std::vector<Step>& lightning, const std::vector<Step>& lockstep) {
  ASSERT_EQ(lightning.size(), 10u);
  ASSERT_EQ(lockstep.size(), 10u);
  double largest = 0;
  for (size_t i = 0; i < lightning.size(); ++i) {
    EXPECT_EQ(lightning[i].epoch, 1 + static_cast<int64_t>(i) / 5) << "step " << i;
    EXPECT_EQ(lockstep[i].epoch, lightning[i].epoch) << "step " << i;
    EXPECT_EQ(lightning[i].lr, i < 5 ? 1e-3 : 5e-4) << "step " << i;
    EXPECT_NEAR(lockstep[i].loss, lightning[i].loss, kTolerance) << "step " << i;
    largest = std::max(largest, std::abs(lockstep[i].loss - lightning[i].loss));
  }
  std::cout << "largest loss difference over the resumed steps: " << largest << "\n";
}

TEST(LightningResume, LockstepResumesLightningsCkptAsLightningDoes) {
  if (const auto missing = lightning_missing(); !missing.empty()) GTEST_SKIP() << missing;
  testing::TempDir dir("lockstep_from_lightning");
  run_lightning(dir / "first", {"--max-epochs", "1", "--checkpoint-dir", dir / "ckpt"});
  const std::string ckpt = dir / "ckpt/last.ckpt";
  ASSERT_TRUE(std::filesystem::exists(ckpt));
  const auto theirs = run_lightning(dir / "again", {"--max-epochs", "3", "--ckpt-path", ckpt});
  const auto ours = run_lockstep(dir / "lockstep", {"--max-epochs", "3", "--ckpt-path", ckpt});
  ASSERT_EQ(ours.command.exit_code, 0) << ours.command.err;
  expect_same_losses(theirs, ours.steps);
  // One note, naming what did not carry over.
  const std::string& err = ours.command.err;
  const auto note = err.find("is a Lightning 2.");
  ASSERT_NE(note, std::string::npos) << err;
  EXPECT_EQ(err.find("is a Lightning 2.", note + 1), std::string::npos) << err;
  for (const char* part : {"continues at epoch 1", "global step 5", "(Adam)", "Not carried over", "callbacks' state",
                           "ModelCheckpoint", "lr_lambdas", "\"hyper_parameters\" ('lr', 'lr_gamma', 'batch_size')"}) {
    EXPECT_NE(err.find(part), std::string::npos) << part << " in:\n" << err;
  }
  EXPECT_NE(ours.command.out.find("\"global_step\":15"), std::string::npos) << ours.command.out;
  // A model of other shapes, and a rename rule with Lockstep's own checkpoint: exit 2, the fix named.
  const auto cnn = run_lockstep(dir / "cnn", {"--model", "cnn", "--max-epochs", "3", "--ckpt-path", ckpt});
  EXPECT_EQ(cnn.command.exit_code, 2) << cnn.command.err;
  EXPECT_NE(cnn.command.err.find("--ckpt-path-rename"), std::string::npos) << cnn.command.err;
  const auto renamed = run_lockstep(dir / "renamed", {"--max-epochs", "2", "--ckpt-path", ckpt, "--ckpt-path-rename", "=net."});
  EXPECT_EQ(renamed.command.exit_code, 0) << renamed.command.err;
  EXPECT_NE(renamed.command.err.find("'=net.'"), std::string::npos) << renamed.command.err;
}

TEST(LightningResume, LightningResumesLockstepsCkptAfterTheRecipe) {
  if (const auto missing = lightning_missing(); !missing.empty()) GTEST_SKIP() << missing;
  testing::TempDir dir("lockstep_to_lightning");
  ASSERT_EQ(run_lockstep(dir / "runs", {"--max-epochs", "1"}).command.exit_code, 0);
  const std::string ours_ckpt = dir / "runs/lockstep_logs/version_0/checkpoints/last.ckpt";
  const auto ours = run_lockstep(dir / "runs", {"--max-epochs", "3", "--ckpt-path", "last"});
  ASSERT_EQ(ours.command.exit_code, 0) << ours.command.err;
  const std::string converter = std::string(LOCKSTEP_SOURCE_DIR) + "/tools/python/lockstep_to_lightning.py";
  const auto converted = run_command({lightning_python(), converter, ours_ckpt, dir / "lightning.ckpt", "--rename", "net.="},
                                     quiet_env(dir.path()), std::chrono::seconds(60));
  ASSERT_EQ(converted.exit_code, 0) << converted.err;
  const auto theirs = run_lightning(dir / "lightning", {"--max-epochs", "3", "--ckpt-path", dir / "lightning.ckpt"});
  expect_same_losses(theirs, ours.steps);
  // A rule without '=' is one message and exit code 2, and nothing is written.
  const auto bad = run_command({lightning_python(), converter, ours_ckpt, dir / "bad.ckpt", "--rename", "net."},
                               quiet_env(dir.path()), std::chrono::seconds(60));
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
  EXPECT_NE(bad.err.find("has no '='"), std::string::npos) << bad.err;
  EXPECT_FALSE(std::filesystem::exists(dir / "bad.ckpt"));
}

}  // namespace lightning_checkpoint_test
}  // namespace lockstep
