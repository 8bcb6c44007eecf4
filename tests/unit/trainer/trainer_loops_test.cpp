// Which batches the loops run: validation within and across epochs (val_check_interval,
// check_val_every_n_epoch) and the DataModule's loaders for each stage.
#include <lockstep/trainer/trainer.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <lockstep/core/error.h>

#include "../../support/trainer_runs.h"

namespace lockstep {
namespace {

using testing::loader_of;
using testing::regression_data;
using Checks = std::vector<std::pair<int64_t, int64_t>>;  // (epoch, training batches done in it)

/// Records where each (non-sanity) validation ran, and logs the epoch mean of the batch index.
struct ValidationRecorder : testing::Regressor {
  torch::Tensor training_step(Batch& batch, int64_t batch_idx) override {
    batches_done = batch_idx + 1;
    log("batch_index", static_cast<double>(batch_idx), LogOptions().on_step(false).on_epoch(true));
    return Regressor::training_step(batch, batch_idx);
  }
  void on_fit_start() override { fit_started = true; }
  void on_validation_epoch_end() override {
    if (!trainer()->sanity_checking()) checks.emplace_back(current_epoch(), batches_done);
  }
  int64_t batches_done = 0;
  bool fit_started = false;
  Checks checks;
};

class ValCheckInterval : public ::testing::Test {
 protected:
  void SetUp() override { torch::set_num_threads(1); }
  TrainerOptions options(const std::string& interval, int64_t epochs = 2) const {
    return testing::quiet_options(dir).max_epochs(epochs).val_check_interval(
        BatchLimit::parse(interval, "--val-check-interval"));
  }
  /// Fits on 10 training batches of 8 and 1 validation batch; returns where validation ran.
  Checks checks(const TrainerOptions& o) {
    model = std::make_shared<ValidationRecorder>();
    trainer = std::make_unique<Trainer>(o);
    trainer->fit(model, loader_of(regression_data(80), 8), loader_of(regression_data(8, 8, 9), 8));
    return model->checks;
  }
  std::string usage_error(const TrainerOptions& o) {
    try {
      checks(o);
    } catch (const UsageError& e) {
      return e.what();
    }
    return "<accepted>";
  }
  /// metrics.csv as rows of column name -> cell (empty for a value the row does not have).
  std::vector<std::map<std::string, std::string>> csv_rows() const {
    std::ifstream csv(std::filesystem::path(trainer->log_dir()) / "metrics.csv");
    EXPECT_TRUE(csv) << trainer->log_dir();
    auto split = [](const std::string& line) {
      std::vector<std::string> cells;
      std::stringstream in(line);
      for (std::string cell; std::getline(in, cell, ',');) cells.push_back(cell);
      if (!line.empty() && line.back() == ',') cells.emplace_back();
      return cells;
    };
    std::string line;
    std::getline(csv, line);
    const auto header = split(line);
    std::vector<std::map<std::string, std::string>> rows;
    while (std::getline(csv, line)) {
      const auto cells = split(line);
      std::map<std::string, std::string> row;
      for (size_t k = 0; k < header.size(); ++k) row[header[k]] = k < cells.size() ? cells[k] : "";
      rows.push_back(std::move(row));
    }
    return rows;
  }
  testing::TempDir dir{"val_check_interval"};
  std::shared_ptr<ValidationRecorder> model;
  std::unique_ptr<Trainer> trainer;
};

TEST_F(ValCheckInterval, DefaultValidatesAtEachEpochEnd) {
  EXPECT_EQ(checks(options("1.0")), (Checks{{0, 10}, {1, 10}}));
  EXPECT_EQ(trainer->val_check_batch(), 10);
}

TEST_F(ValCheckInterval, AFractionValidatesWithinTheEpoch) {
  EXPECT_EQ(checks(options("0.5")), (Checks{{0, 5}, {0, 10}, {1, 5}, {1, 10}}));
  EXPECT_EQ(checks(options("0.25", 1)), (Checks{{0, 2}, {0, 4}, {0, 6}, {0, 8}, {0, 10}}));
  // As Lightning: every floor(0.3 * 10) = 3 batches, so not after the 10th.
  EXPECT_EQ(checks(options("0.3", 1)), (Checks{{0, 3}, {0, 6}, {0, 9}}));
  EXPECT_EQ(trainer->val_check_batch(), 3);
  // A fraction too small for one batch still validates after every batch.
  EXPECT_EQ(checks(options("0.01", 1)).size(), 10u);
}

TEST_F(ValCheckInterval, ACountValidatesEveryNTrainingBatches) {
  EXPECT_EQ(checks(options("4")), (Checks{{0, 4}, {0, 8}, {1, 4}, {1, 8}}));
  EXPECT_EQ(checks(options("10")), (Checks{{0, 10}, {1, 10}}));
  EXPECT_EQ(checks(options("1", 1)).size(), 10u);
}

TEST_F(ValCheckInterval, FollowsLimitTrainBatchesAndCheckValEveryNEpoch) {
  EXPECT_EQ(checks(options("0.5").limit_train_batches(6)), (Checks{{0, 3}, {0, 6}, {1, 3}, {1, 6}}));
  EXPECT_EQ(checks(options("0.5", 4).check_val_every_n_epoch(2)), (Checks{{1, 5}, {1, 10}, {3, 5}, {3, 10}}));
  EXPECT_EQ(checks(options("3", 3).check_val_every_n_epoch(3)), (Checks{{2, 3}, {2, 6}, {2, 9}}));
}

TEST_F(ValCheckInterval, AnEpochCutShortByMaxStepsValidatesOnceMore) {
  EXPECT_EQ(checks(options("0.5", -1).max_steps(7)), (Checks{{0, 5}, {0, 7}}));
  EXPECT_EQ(checks(options("0.5", -1).max_steps(5)), (Checks{{0, 5}})) << "not twice after the 5th batch";
}

TEST_F(ValCheckInterval, TrainingEpochMeansSurviveValidationWithinTheEpoch) {
  checks(options("0.3", 1));
  // The mean of batch indices 0..9; validation after batches 3, 6, 9 must not reset the sums.
  EXPECT_DOUBLE_EQ(trainer->callback_metrics().at("batch_index"), 4.5);
}

TEST_F(ValCheckInterval, ValidationRowsAreLoggedAtTheirSteps) {
  checks(options("0.5"));
  std::vector<std::string> steps;
  for (const auto& row : csv_rows()) {
    if (!row.at("val_loss").empty()) steps.push_back(row.at("step"));
  }
  EXPECT_EQ(steps, (std::vector<std::string>{"5", "10", "15", "20"}));
}

// Step values not yet logged (every 50 steps by default) are written at the end of fit, labelled
// with the epoch they came from: 2 epochs of 10 steps give one train_loss row, at step 20, epoch 1.
TEST_F(ValCheckInterval, LastStepRowsCarryTheLastEpoch) {
  checks(options("1.0"));
  std::vector<std::pair<std::string, std::string>> train_rows;
  for (const auto& row : csv_rows()) {
    if (!row.at("train_loss").empty()) train_rows.emplace_back(row.at("step"), row.at("epoch"));
  }
  EXPECT_EQ(train_rows, (std::vector<std::pair<std::string, std::string>>{{"20", "1"}}));
}

TEST_F(ValCheckInterval, BadValuesAreUsageErrorsBeforeTraining) {
  // Refused as they are read (the flag parses them: exit code 2 before any process starts).
  for (const char* text : {"-3", "-0.5", "ten", ""}) {
    EXPECT_THROW(BatchLimit::parse(text, "--val-check-interval"), UsageError) << "'" << text << "'";
  }
  // Refused by fit, which knows the epoch, before its first batch.
  const std::vector<std::pair<std::string, std::string>> cases{
      {"0", "must be at least 1"},
      {"0.0", "must be in (0, 1]"},
      {"11", "only 10 batch(es)"},
  };
  for (const auto& [interval, needle] : cases) {
    const std::string message = usage_error(options(interval));
    EXPECT_NE(message.find(needle), std::string::npos) << "'" << interval << "': " << message;
    EXPECT_FALSE(model->fit_started) << "'" << interval << "'";
    EXPECT_EQ(trainer->global_step(), 0) << "'" << interval << "'";
  }
  const std::string limited = usage_error(options("5").limit_train_batches(4));
  EXPECT_NE(limited.find("Use at most 4"), std::string::npos) << limited;
  const std::string every = usage_error(options("1.0").check_val_every_n_epoch(0));
  EXPECT_NE(every.find("--check-val-every-n-epoch 0: use 1 or more"), std::string::npos) << every;
}

/// Counts the batches each stage's step sees, and the markers (targets) they carry.
struct StageCounter : testing::Regressor {
  torch::Tensor training_step(Batch& batch, int64_t batch_idx) override {
    note("train", batch);
    return Regressor::training_step(batch, batch_idx);
  }
  void validation_step(Batch& batch, int64_t batch_idx) override {
    note("val", batch);
    Regressor::validation_step(batch, batch_idx);
  }
  void test_step(Batch& batch, int64_t) override { note("test", batch); }
  torch::Tensor predict_step(Batch& batch, int64_t) override {
    note("predict", batch);
    return forward(batch.data);
  }
  void note(const std::string& stage, const Batch& batch) {
    ++batches[stage];
    markers[stage].insert(batch.target.min().item<double>());
    markers[stage].insert(batch.target.max().item<double>());
  }
  std::map<std::string, int> batches;
  std::map<std::string, std::set<double>> markers;
};

/// Each stage's loader has its own size and marker; counts how often each is asked for.
struct MarkedDataModule : DataModule {
  std::shared_ptr<DataLoader> train_dataloader() override { return make("train", 40, 1); }
  std::shared_ptr<DataLoader> val_dataloader() override { return make("val", 24, 2); }
  std::shared_ptr<DataLoader> test_dataloader() override { return make("test", 16, 3); }
  std::shared_ptr<DataLoader> predict_dataloader() override { return make("predict", 32, 4); }
  std::shared_ptr<DataLoader> make(const std::string& stage, int64_t n, double marker) {
    ++requests[stage];
    return loader_of(testing::marked_data(n, marker), 8);
  }
  std::map<std::string, int> requests;
};

struct TrainOnlyDataModule : DataModule {
  std::shared_ptr<DataLoader> train_dataloader() override { return loader_of(testing::marked_data(16, 1), 8); }
};

TEST(DataModuleStages, EachStageRunsOnItsOwnLoader) {
  torch::set_num_threads(1);
  testing::TempDir dir("datamodule");
  auto model = std::make_shared<StageCounter>();
  MarkedDataModule data;
  Trainer trainer(testing::quiet_options(dir)
                      .max_epochs(2)
                      .num_sanity_val_steps(1)
                      .limit_train_batches(3)
                      .limit_val_batches(2)
                      .limit_test_batches(1.0));
  trainer.fit(model, data);
  EXPECT_EQ(model->batches["train"], 2 * 3) << "2 epochs of limit_train_batches=3 (of 5)";
  EXPECT_EQ(model->batches["val"], 1 + 2 * 2) << "1 sanity batch, then limit_val_batches=2 (of 3) per epoch";
  EXPECT_EQ(trainer.num_training_batches(), 3);
  EXPECT_EQ(trainer.num_val_batches(), 2);

  trainer.test(model, data);
  EXPECT_EQ(model->batches["test"], 2) << "all 2 test batches";
  trainer.validate(model, data);
  EXPECT_EQ(model->batches["val"], 5 + 2);
  const auto predictions = trainer.predict(model, data);
  EXPECT_EQ(model->batches["predict"], 4);
  ASSERT_EQ(predictions.size(), 4u);
  int64_t rows = 0;
  for (const auto& p : predictions) rows += p.size(0);
  EXPECT_EQ(rows, 32);

  const std::map<std::string, std::set<double>> expected{
      {"train", {1}}, {"val", {2}}, {"test", {3}}, {"predict", {4}}};
  EXPECT_EQ(model->markers, expected);
  const std::map<std::string, int> requests{{"train", 1}, {"val", 2}, {"test", 1}, {"predict", 1}};
  EXPECT_EQ(data.requests, requests);
}

TEST(DataModuleStages, AStageWithoutALoaderIsAUsageError) {
  torch::set_num_threads(1);
  testing::TempDir dir("datamodule");
  auto model = std::make_shared<StageCounter>();
  TrainOnlyDataModule data;
  Trainer trainer(testing::quiet_options(dir).max_epochs(1));
  trainer.fit(model, data);
  EXPECT_EQ(model->batches["train"], 2);
  EXPECT_EQ(model->batches.count("val"), 0u) << "no val_dataloader: no validation";
  for (const std::string stage : {"val", "test", "predict"}) {
    try {
      if (stage == "val") trainer.validate(model, data);
      if (stage == "test") trainer.test(model, data);
      if (stage == "predict") trainer.predict(model, data);
      ADD_FAILURE() << stage << " ran without a loader";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("DataModule::" + stage + "_dataloader() returned no loader"),
                std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace lockstep
