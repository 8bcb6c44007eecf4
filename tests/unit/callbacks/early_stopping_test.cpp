#include <lockstep/callbacks/early_stopping.h>

#include <unistd.h>

#include <filesystem>
#include <limits>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <lockstep/callbacks/model_checkpoint.h>
#include <lockstep/core/error.h>
#include <lockstep/trainer/trainer.h>

#include "../../support/regression.h"

namespace lockstep {
namespace early_stopping_test {
namespace {

namespace fs = std::filesystem;
using testing::regression_data;

/// Logs `val_score` = values[epoch] in validation: the sequence EarlyStopping sees.
struct ScriptedScore : testing::Regressor {
  explicit ScriptedScore(std::vector<double> values) : values(std::move(values)) {}
  void validation_step(Batch& batch, int64_t) override { log("val_score", values.at(current_epoch())); }
  std::vector<double> values;
};

class EarlyStoppingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    torch::set_num_threads(1);
    root = fs::temp_directory_path() / ("early_stopping_test_" + std::to_string(::getpid()));
    fs::remove_all(root);
  }
  void TearDown() override { fs::remove_all(root); }

  TrainerOptions options(int64_t epochs) const {
    return TrainerOptions()
        .max_epochs(epochs)
        .enable_progress_bar(false)
        .enable_checkpointing(false)
        .num_sanity_val_steps(0)
        .default_root_dir(root.string());
  }
  /// Fits a ScriptedScore on `values` with `stopper`; returns the epochs that ran.
  int64_t run(const std::vector<double>& values, const std::shared_ptr<EarlyStopping>& stopper,
              TrainerOptions o, std::shared_ptr<Callback> other = nullptr) {
    Trainer trainer(o);
    trainer.add_callback(stopper);
    if (other) trainer.add_callback(other);
    trainer.fit(std::make_shared<ScriptedScore>(values),
                std::make_shared<DataLoader>(regression_data(32), DataLoaderOptions(16)),
                std::make_shared<DataLoader>(regression_data(16, 8, 9), DataLoaderOptions(16)));
    return trainer.current_epoch();
  }

  fs::path root;
};

TEST_F(EarlyStoppingTest, StopsAfterPatienceChecksWithoutImprovement) {
  auto stopper = std::make_shared<EarlyStopping>(EarlyStoppingOptions("val_score").patience(3));
  // Best 0.9 at epoch 1; epochs 2, 3, 4 do not beat it: stop after epoch 4.
  EXPECT_EQ(run({1.0, 0.9, 0.95, 0.92, 0.91, 0.5, 0.4, 0.3, 0.2, 0.1}, stopper, options(10)), 5);
  EXPECT_EQ(stopper->stopped_epoch(), 4);
  EXPECT_EQ(stopper->wait_count(), 3);
  EXPECT_DOUBLE_EQ(stopper->best_score(), 0.9);
  EXPECT_EQ(stopper->reason(),
            "Monitored metric val_score did not improve in the last 3 records. Best score: 0.900. Signaling "
            "Trainer to stop.");
}

// Rank 0 says why it stopped, in one line: the epoch, the metric, its best, the patience.
TEST_F(EarlyStoppingTest, SaysWhyItStoppedInOneLine) {
  auto stopper = std::make_shared<EarlyStopping>(EarlyStoppingOptions("val_score").patience(2));
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(run({1.0, 0.8, 0.85, 0.9, 0.1}, stopper, options(5)), 4);
  const std::string err = ::testing::internal::GetCapturedStderr();
  const std::string line = "lockstep: EarlyStopping stopped training at epoch 3 (monitor val_score, mode min, best "
                           "0.800, patience 2): Monitored metric val_score did not improve in the last 2 records. Best "
                           "score: 0.800.\n";
  EXPECT_NE(err.find(line), std::string::npos) << err;
  EXPECT_EQ(err.find("EarlyStopping", err.find(line) + line.size()), std::string::npos) << "one line: " << err;
  auto improving = std::make_shared<EarlyStopping>(EarlyStoppingOptions("val_score").patience(1));
  ::testing::internal::CaptureStderr();
  run({1.0, 0.9}, improving, options(2));
  EXPECT_EQ(::testing::internal::GetCapturedStderr().find("EarlyStopping"), std::string::npos) << "no stop, no line";
}

TEST_F(EarlyStoppingTest, KeepsTrainingWhileItImproves) {
  auto stopper = std::make_shared<EarlyStopping>(EarlyStoppingOptions("val_score").patience(1));
  EXPECT_EQ(run({1.0, 0.9, 0.8, 0.7}, stopper, options(4)), 4);
  EXPECT_EQ(stopper->stopped_epoch(), 0);
  EXPECT_EQ(stopper->wait_count(), 0);
  EXPECT_DOUBLE_EQ(stopper->best_score(), 0.7);
}

TEST_F(EarlyStoppingTest, MinDeltaIgnoresSmallImprovements) {
  const std::vector<double> values{1.0, 0.96, 0.90, 0.88, 0.87, 0.86, 0.85, 0.84};
  auto stopper = std::make_shared<EarlyStopping>(EarlyStoppingOptions("val_score").patience(2).min_delta(0.05));
  // 0.96 is not 0.05 better than 1.0; 0.90 is; 0.88 and 0.87 are not 0.05 better than 0.90.
  EXPECT_EQ(run(values, stopper, options(8)), 5);
  EXPECT_EQ(stopper->stopped_epoch(), 4);
  EXPECT_DOUBLE_EQ(stopper->best_score(), 0.90);
  // Without min_delta every epoch improves.
  auto strict_improvement = std::make_shared<EarlyStopping>(EarlyStoppingOptions("val_score").patience(2));
  EXPECT_EQ(run(values, strict_improvement, options(8)), 8);
}

TEST_F(EarlyStoppingTest, MaxModeAndStoppingThreshold) {
  auto stopper = std::make_shared<EarlyStopping>(
      EarlyStoppingOptions("val_score").mode("max").patience(5).stopping_threshold(0.9));
  EXPECT_EQ(run({0.5, 0.8, 0.95, 0.97, 0.99}, stopper, options(5)), 3);
  EXPECT_EQ(stopper->stopped_epoch(), 2);
  EXPECT_EQ(stopper->reason(), "Stopping threshold reached: val_score = 0.95 > 0.9. Signaling Trainer to stop.");
}

TEST_F(EarlyStoppingTest, DivergenceAndNonFiniteStopAtOnce) {
  auto diverged = std::make_shared<EarlyStopping>(
      EarlyStoppingOptions("val_score").patience(10).divergence_threshold(5.0));
  EXPECT_EQ(run({1.0, 2.0, 6.0, 1.0, 1.0}, diverged, options(5)), 3);
  EXPECT_EQ(diverged->stopped_epoch(), 2);
  EXPECT_EQ(diverged->reason(), "Divergence threshold reached: val_score = 6.0 > 5.0. Signaling Trainer to stop.");

  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto finite = std::make_shared<EarlyStopping>(EarlyStoppingOptions("val_score").patience(10));
  EXPECT_EQ(run({1.0, nan, 0.5, 0.4}, finite, options(4)), 2);
  EXPECT_EQ(finite->stopped_epoch(), 1);
  EXPECT_EQ(finite->reason(),
            "Monitored metric val_score = nan is not finite. Previous best value was 1.000. Signaling Trainer to stop.");
}

TEST_F(EarlyStoppingTest, ChecksAfterValidationWhenValidationSkipsEpochs) {
  // Validation runs after epochs 1, 3, 5 only; an epoch-end check would fail on epoch 0 (no
  // metric yet) and count stale values twice.
  auto stopper = std::make_shared<EarlyStopping>(EarlyStoppingOptions("val_score").patience(1));
  EXPECT_EQ(run({0, 1.0, 0, 1.1, 0, 0.5}, stopper, options(6).check_val_every_n_epoch(2)), 4);
  EXPECT_EQ(stopper->stopped_epoch(), 3);
  EXPECT_DOUBLE_EQ(stopper->best_score(), 1.0);
}

TEST_F(EarlyStoppingTest, ChecksEachValidationWithinTheEpochAndStopsThere) {
  // 4 training batches an epoch, validation after each (val_check_interval 1): the score worsens
  // at the 2nd validation, so patience 1 stops in epoch 0 after its 2nd batch. An epoch-end
  // check would first see the 4th score (a best) and stop at the end of epoch 1.
  struct ScorePerValidation : testing::Regressor {
    void validation_step(Batch&, int64_t) override { log("val_score", 1.0 + 0.1 * validations); }
    void on_validation_epoch_end() override { ++validations; }
    int validations = 0;
  };
  auto stopper = std::make_shared<EarlyStopping>(EarlyStoppingOptions("val_score").patience(1));
  auto model = std::make_shared<ScorePerValidation>();
  Trainer trainer(options(3).val_check_interval(1));
  trainer.add_callback(stopper);
  trainer.fit(model, std::make_shared<DataLoader>(regression_data(64), DataLoaderOptions(16)),
              std::make_shared<DataLoader>(regression_data(16, 8, 9), DataLoaderOptions(16)));
  EXPECT_EQ(model->validations, 2);
  EXPECT_EQ(trainer.global_step(), 2);
  EXPECT_EQ(stopper->stopped_epoch(), 0);
  EXPECT_DOUBLE_EQ(stopper->best_score(), 1.0);
}

TEST_F(EarlyStoppingTest, ResumeContinuesTheCount) {
  const std::vector<double> values{1.0, 0.9, 0.95, 0.96, 0.97, 0.98, 0.99, 1.0, 1.01, 1.02};
  auto options_for = [] { return EarlyStoppingOptions("val_score").patience(3); };
  const std::string dir = (root / "ckpts").string();
  // The checkpoint is written after EarlyStopping's epoch-end check (it comes later), so it holds
  // the count including that epoch.
  auto first = std::make_shared<EarlyStopping>(options_for());
  run(values, first, options(3), std::make_shared<ModelCheckpoint>(ModelCheckpointOptions().dirpath(dir).save_last(true)));
  EXPECT_EQ(first->wait_count(), 1);

  auto resumed = std::make_shared<EarlyStopping>(options_for());
  const int64_t epochs = run(values, resumed, options(10).ckpt_path(dir + "/last.ckpt"),
                             std::make_shared<ModelCheckpoint>(ModelCheckpointOptions().dirpath(dir).save_last(true)));
  // Restored wait 1 after epoch 2: epochs 3 and 4 bring it to 3. From scratch it would stop at 6.
  EXPECT_EQ(epochs, 5);
  EXPECT_EQ(resumed->stopped_epoch(), 4);
  EXPECT_DOUBLE_EQ(resumed->best_score(), 0.9);
}

TEST_F(EarlyStoppingTest, StateDictRoundTrips) {
  auto stopper = std::make_shared<EarlyStopping>(EarlyStoppingOptions("val_score").patience(5));
  run({1.0, 0.8, 0.85, 0.9}, stopper, options(4));
  EarlyStopping copy(EarlyStoppingOptions("val_score").patience(5));
  copy.load_state_dict(stopper->state_dict());
  EXPECT_EQ(copy.wait_count(), 2);
  EXPECT_DOUBLE_EQ(copy.best_score(), 0.8);
  EXPECT_EQ(copy.stopped_epoch(), 0);
  EXPECT_EQ(stopper->name(), "EarlyStopping{'monitor': 'val_score', 'mode': 'min'}");
}

TEST_F(EarlyStoppingTest, MissingMonitorIsAUsageErrorUnlessNotStrict) {
  auto stopper = std::make_shared<EarlyStopping>(EarlyStoppingOptions("val_scor"));
  try {
    run({1.0, 0.9}, stopper, options(2));
    FAIL() << "expected a UsageError";
  } catch (const UsageError& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.rfind("Early stopping conditioned on metric `val_scor` which is not available. Pass in or modify "
                            "your `EarlyStopping` callback to use any of the following: ",
                            0),
              0u)
        << message;
    EXPECT_NE(message.find("`val_score`"), std::string::npos) << message;
  }
  auto lenient = std::make_shared<EarlyStopping>(EarlyStoppingOptions("val_scor").strict(false).patience(0));
  EXPECT_EQ(run({1.0, 0.9}, lenient, options(2)), 2);
  EXPECT_THROW(EarlyStopping(EarlyStoppingOptions("x").mode("lowest")), UsageError);
  EXPECT_THROW(EarlyStopping(EarlyStoppingOptions("x").patience(-1)), UsageError);
}

}  // namespace
}  // namespace early_stopping_test
}  // namespace lockstep
