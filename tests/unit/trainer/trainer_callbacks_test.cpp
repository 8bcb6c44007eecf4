// The Trainer's side of the callbacks: default callbacks, their order, the profiler's call sites.
#include <lockstep/trainer/trainer.h>

#include <unistd.h>

#include <filesystem>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <lockstep/callbacks/early_stopping.h>
#include <lockstep/callbacks/model_checkpoint.h>
#include <lockstep/callbacks/progress_bar.h>
#include <lockstep/callbacks/simple_profiler.h>

#include "../../support/regression.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;
using testing::regression_data;

class TrainerCallbacksTest : public ::testing::Test {
 protected:
  void SetUp() override {
    torch::set_num_threads(1);
    root = fs::temp_directory_path() / ("trainer_callbacks_test_" + std::to_string(::getpid()));
    fs::remove_all(root);
  }
  void TearDown() override { fs::remove_all(root); }
  TrainerOptions options() const {
    return TrainerOptions().max_epochs(2).num_sanity_val_steps(0).default_root_dir(root.string());
  }
  // 2 epochs of 2 training batches and 1 validation batch.
  void fit(Trainer& trainer) {
    trainer.fit(std::make_shared<testing::Regressor>(),
                std::make_shared<DataLoader>(regression_data(32), DataLoaderOptions(16)),
                std::make_shared<DataLoader>(regression_data(16, 8, 9), DataLoaderOptions(16)));
  }
  fs::path root;
};

TEST_F(TrainerCallbacksTest, AddsAProgressBarAndACheckpointByDefault) {
  Trainer trainer(options());
  ::testing::internal::CaptureStderr();
  fit(trainer);
  const std::string err = ::testing::internal::GetCapturedStderr();
  ASSERT_EQ(trainer.callbacks().size(), 2u);
  EXPECT_NE(dynamic_cast<ProgressBar*>(trainer.callbacks()[0].get()), nullptr);
  auto* checkpoint = dynamic_cast<ModelCheckpoint*>(trainer.callbacks()[1].get());
  ASSERT_NE(checkpoint, nullptr);
  const auto expected = fs::path(trainer.log_dir()) / "checkpoints" / "epoch=1-step=4.ckpt";
  EXPECT_EQ(checkpoint->best_model_path(), expected.string());
  EXPECT_TRUE(fs::exists(expected));
  EXPECT_TRUE(fs::exists(expected.parent_path() / "last.ckpt"));
  EXPECT_NE(err.find("Epoch 1"), std::string::npos) << err;

  Trainer quiet(options().enable_progress_bar(false).enable_checkpointing(false));
  fit(quiet);
  EXPECT_TRUE(quiet.callbacks().empty());
  EXPECT_EQ(quiet.profiler(), nullptr);
}

TEST_F(TrainerCallbacksTest, CheckpointsRunAfterOtherCallbacksAndAreNotDuplicated) {
  Trainer trainer(options().enable_progress_bar(false));
  auto mine = std::make_shared<ModelCheckpoint>(ModelCheckpointOptions().dirpath((root / "mine").string()));
  auto stopper = std::make_shared<EarlyStopping>(EarlyStoppingOptions("val_loss"));
  trainer.add_callback(mine);
  trainer.add_callback(stopper);
  fit(trainer);
  ASSERT_EQ(trainer.callbacks().size(), 2u);
  EXPECT_EQ(trainer.callbacks()[0], stopper);
  EXPECT_EQ(trainer.callbacks()[1], mine);
}

// Records what goes through it, then does it.
struct RecordingIO : checkpoint::CheckpointIO {
  void save(const c10::IValue& checkpoint, const std::string& path) const override {
    calls.push_back("save " + fs::path(path).filename().string());
    CheckpointIO::save(checkpoint, path);
  }
  checkpoint::Checkpoint load(const std::string& path) const override {
    calls.push_back("load " + fs::path(path).filename().string());
    return CheckpointIO::load(path);
  }
  void remove(const std::string& path) const override {
    calls.push_back("remove " + fs::path(path).filename().string());
    CheckpointIO::remove(path);
  }
  mutable std::vector<std::string> calls;
};

// Every save, load and removal of the Trainer and its ModelCheckpoint goes through the
// CheckpointIO the Trainer was given.
TEST_F(TrainerCallbacksTest, EveryCheckpointGoesThroughTheTrainersCheckpointIO) {
  auto io = std::make_shared<RecordingIO>();
  Trainer trainer(options().enable_progress_bar(false));
  trainer.set_checkpoint_io(io);
  fit(trainer);
  EXPECT_EQ(io->calls, (std::vector<std::string>{"save epoch=0-step=2.ckpt", "save last.ckpt", "save epoch=1-step=4.ckpt",
                                                 "remove epoch=0-step=2.ckpt", "save last.ckpt"}));
  auto resumed_io = std::make_shared<RecordingIO>();
  Trainer resumed(options().enable_progress_bar(false).max_epochs(3).ckpt_path(
      (fs::path(trainer.log_dir()) / "checkpoints" / "last.ckpt").string()));
  resumed.set_checkpoint_io(resumed_io);
  fit(resumed);
  ASSERT_FALSE(resumed_io->calls.empty());
  EXPECT_EQ(resumed_io->calls.front(), "load last.ckpt");
  EXPECT_EQ(resumed.global_step(), 6);
}

// --fast-dev-run 2: one epoch of 2 training batches and 2 validation batches, with a
// ModelCheckpoint and an EarlyStopping the user added and the default logger: nothing is written
// under the root (no logs, no checkpoints), and one line says so.
TEST_F(TrainerCallbacksTest, FastDevRunTrainsTwoBatchesOnceAndWritesNothing) {
  Trainer trainer(options().max_epochs(5).fast_dev_run(2).num_sanity_val_steps(2));
  trainer.add_callback(std::make_shared<ModelCheckpoint>(ModelCheckpointOptions().dirpath((root / "ckpts").string())));
  trainer.add_callback(std::make_shared<EarlyStopping>(EarlyStoppingOptions("val_loss").patience(0)));
  ::testing::internal::CaptureStderr();
  trainer.fit(std::make_shared<testing::Regressor>(),
              std::make_shared<DataLoader>(regression_data(64), DataLoaderOptions(8)),
              std::make_shared<DataLoader>(regression_data(32, 8, 9), DataLoaderOptions(8)));
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(trainer.global_step(), 2);
  EXPECT_EQ(trainer.current_epoch(), 1);
  EXPECT_EQ(trainer.num_val_batches(), 2);
  EXPECT_FALSE(fs::exists(root / "ckpts"));
  EXPECT_FALSE(fs::exists(root / "lockstep_logs"));
  EXPECT_NE(err.find("fast_dev_run mode: will run the requested loop using 2 batch(es). Logging and checkpointing is "
                     "suppressed."),
            std::string::npos)
      << err;
}

TEST_F(TrainerCallbacksTest, ProgressBarShowsEveryStepsValue) {
  // log_every_n_steps 50 writes no step row in 4 steps; the bar still shows the loss.
  Trainer trainer(options().enable_checkpointing(false).enable_progress_bar(false));
  trainer.add_callback(std::make_shared<ProgressBar>(ProgressBarOptions().live(false).print_every_percent(50)));
  ::testing::internal::CaptureStderr();
  fit(trainer);
  const std::string err = ::testing::internal::GetCapturedStderr();
  const size_t first = err.find("Epoch 0:  50% 1/2 [");
  ASSERT_NE(first, std::string::npos) << err;
  const std::string line = err.substr(first, err.find('\n', first) - first);
  EXPECT_NE(line.find("it/s, train_loss="), std::string::npos) << line;
  EXPECT_TRUE(trainer.progress_bar_metrics().count("train_loss"));
}

TEST_F(TrainerCallbacksTest, ProfilerTimesEachPhaseAndHook) {
  Trainer trainer(options().enable_checkpointing(false).profiler("simple").enable_progress_bar(false));
  trainer.add_callback(std::make_shared<ProgressBar>(ProgressBarOptions().live(false)));
  ::testing::internal::CaptureStderr();
  fit(trainer);
  const std::string err = ::testing::internal::GetCapturedStderr();
  auto* profiler = dynamic_cast<SimpleProfiler*>(trainer.profiler());
  ASSERT_NE(profiler, nullptr);
  const auto stats = profiler->stats();
  const std::map<std::string, int64_t> expected{{"run_training_epoch", 2},
                                                {"train_dataloader_next", 4},
                                                {"transfer_batch_to_device", 4},
                                                {"training_step", 4},
                                                {"backward", 4},
                                                {"optimizer_step", 4},
                                                {"validation", 2},
                                                {"val_dataloader_next", 2},
                                                {"validation_step", 2},
                                                {"[Callback]ProgressBar.on_train_batch_end", 4},
                                                {"[Callback]ProgressBar.on_train_epoch_end", 2},
                                                {"[Callback]ProgressBar.on_fit_start", 1}};
  for (const auto& [action, calls] : expected) {
    ASSERT_TRUE(stats.count(action)) << action;
    EXPECT_EQ(stats.at(action).calls, calls) << action;
  }
  EXPECT_LE(stats.at("training_step").total_seconds, stats.at("run_training_epoch").total_seconds);
  EXPECT_NE(err.find("FIT Profiler Report"), std::string::npos) << err;
  EXPECT_NE(err.find("|  training_step "), std::string::npos) << err;
}

}  // namespace
}  // namespace lockstep
