#include <lockstep/callbacks/on_exception_checkpoint.h>

#include <unistd.h>

#include <filesystem>
#include <stdexcept>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <lockstep/checkpoint/checkpoint_io.h>
#include <lockstep/core/error.h>
#include <lockstep/trainer/trainer.h>

#include "../../support/regression.h"

namespace lockstep {
namespace on_exception_checkpoint_test {
namespace {

namespace fs = std::filesystem;
using testing::regression_data;

/// Throws from training_step at batch `fail_batch` of epoch `fail_epoch` (never when negative).
struct Failing : testing::Regressor {
  Failing(int64_t fail_epoch, int64_t fail_batch) : fail_epoch(fail_epoch), fail_batch(fail_batch) {}
  torch::Tensor training_step(Batch& batch, int64_t batch_idx) override {
    if (current_epoch() == fail_epoch && batch_idx == fail_batch) throw std::runtime_error("broken batch");
    return Regressor::training_step(batch, batch_idx);
  }
  int64_t fail_epoch, fail_batch;
};

// The same initial weights in every run.
std::shared_ptr<Failing> failing_at(int64_t epoch, int64_t batch) {
  torch::manual_seed(5);
  return std::make_shared<Failing>(epoch, batch);
}

class OnExceptionCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    torch::set_num_threads(1);
    root = fs::temp_directory_path() / ("on_exception_test_" + std::to_string(::getpid()));
    fs::remove_all(root);
  }
  void TearDown() override { fs::remove_all(root); }

  /// 3 epochs of `examples` / 16 batches.
  std::unique_ptr<Trainer> fit(const std::shared_ptr<Failing>& model, int64_t examples, int64_t accumulate = 1,
                               const std::string& ckpt = "") {
    auto trainer = std::make_unique<Trainer>(TrainerOptions()
                                                 .max_epochs(3)
                                                 .enable_progress_bar(false)
                                                 .enable_checkpointing(false)
                                                 .accumulate_grad_batches(accumulate)
                                                 .ckpt_path(ckpt)
                                                 .default_root_dir(root.string()));
    trainer->add_callback(std::make_shared<OnExceptionCheckpoint>((root / "exc").string()));
    trainer->fit(model, std::make_shared<DataLoader>(regression_data(examples), DataLoaderOptions(16)));
    return trainer;
  }

  fs::path root;
};

TEST_F(OnExceptionCheckpointTest, SavesTheFailingStepAndResumesToTheUninterruptedWeights) {
  auto whole = failing_at(-1, -1);
  fit(whole, 32);
  auto failing = failing_at(1, 1);  // the 4th batch: 3 steps done
  ::testing::internal::CaptureStderr();
  EXPECT_THROW(fit(failing, 32), std::runtime_error);
  const std::string err = ::testing::internal::GetCapturedStderr();
  const std::string path = (root / "exc" / "on_exception.ckpt").string();
  EXPECT_NE(err.find("OnExceptionCheckpoint (rank 0): fit failed at step 3 (epoch 1); saved " + path), std::string::npos)
      << err;
  const auto ckpt = checkpoint::CheckpointIO().load(path);
  EXPECT_EQ(ckpt.at("global_step").toInt(), 3);
  EXPECT_EQ(ckpt.at("loops").toGenericDict().at("next_epoch").toInt(), 1);
  EXPECT_EQ(ckpt.at("loops").toGenericDict().at("next_batch").toInt(), 1);

  auto resumed = failing_at(-1, -1);
  auto trainer = fit(resumed, 32, 1, path);
  EXPECT_EQ(trainer->global_step(), 6);
  EXPECT_EQ(testing::max_abs_diff(*resumed, *whole), 0.0);
}

TEST_F(OnExceptionCheckpointTest, WithinAccumulationItResumesAtTheWindowsFirstBatch) {
  auto whole = failing_at(-1, -1);
  fit(whole, 64, 2);  // 4 batches, 2 steps an epoch
  auto failing = failing_at(1, 3);  // the window of batches 2 and 3, after batch 2
  EXPECT_THROW(fit(failing, 64, 2), std::runtime_error);
  const auto ckpt = checkpoint::CheckpointIO().load((root / "exc" / "on_exception.ckpt").string());
  EXPECT_EQ(ckpt.at("global_step").toInt(), 3);
  EXPECT_EQ(ckpt.at("loops").toGenericDict().at("next_batch").toInt(), 2);

  auto resumed = failing_at(-1, -1);
  auto trainer = fit(resumed, 64, 2, (root / "exc" / "on_exception.ckpt").string());
  EXPECT_EQ(trainer->global_step(), 6);
  EXPECT_EQ(testing::max_abs_diff(*resumed, *whole), 0.0);
}

TEST_F(OnExceptionCheckpointTest, AFailureBeforeFitStartsSavesNothingAndBadArgumentsAreRefused) {
  // --ckpt-path to a file that does not exist fails in setup: nothing trained, nothing to save.
  EXPECT_THROW(fit(failing_at(-1, -1), 32, 1, (root / "missing.ckpt").string()), UsageError);
  EXPECT_FALSE(fs::exists(root / "exc" / "on_exception.ckpt"));
  EXPECT_EQ(OnExceptionCheckpoint("a/b", "last").ckpt_path(), "a/b/last.ckpt");
  EXPECT_THROW(OnExceptionCheckpoint(""), UsageError);
  EXPECT_THROW(OnExceptionCheckpoint("dir", "sub/name"), UsageError);
}

}  // namespace
}  // namespace on_exception_checkpoint_test
}  // namespace lockstep
