#include <lockstep/core/reduce_lr_on_plateau.h>

#include <unistd.h>

#include <filesystem>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <lockstep/callbacks/lr_monitor.h>
#include <lockstep/callbacks/model_checkpoint.h>
#include <lockstep/core/error.h>
#include <lockstep/trainer/trainer.h>

#include "../../support/regression.h"

namespace lockstep {
namespace reduce_lr_on_plateau_test {
namespace {

namespace fs = std::filesystem;
using testing::regression_data;

// The learning rate after each step(metric), and the bad-step count.
std::vector<std::pair<double, int64_t>> steps(const std::vector<double>& metrics, ReduceLROnPlateauOptions options,
                                              double lr = 1.0) {
  auto p = torch::zeros({1}, torch::requires_grad());
  torch::optim::SGD sgd({p}, torch::optim::SGDOptions(lr));
  ReduceLROnPlateau plateau(sgd, options);
  std::vector<std::pair<double, int64_t>> out;
  for (double m : metrics) {
    plateau.step(m);
    out.emplace_back(sgd.param_groups()[0].options().get_lr(), plateau.num_bad_epochs());
  }
  return out;
}

// Expected values: PyTorch 1.13's torch.optim.lr_scheduler.ReduceLROnPlateau on the same
// sequences and arguments (/usr/bin/python3, 2026-12-05).
TEST(ReduceLROnPlateau, MatchesPyTorchInMinRelModeWithCooldownAndMinLr) {
  const std::vector<double> metrics{1.0, 0.95, 0.8, 0.79, 0.78, 0.85, 0.5, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6};
  const auto got = steps(metrics, ReduceLROnPlateauOptions().factor(0.5).patience(2).threshold(0.1).cooldown(1).min_lr(0.2));
  const std::vector<std::pair<double, int64_t>> pytorch{{1.0, 0}, {1.0, 1}, {1.0, 0}, {1.0, 1},  {1.0, 2},
                                                        {0.5, 0}, {0.5, 0}, {0.5, 1}, {0.5, 2},  {0.25, 0},
                                                        {0.25, 0}, {0.25, 1}, {0.25, 2}, {0.2, 0}, {0.2, 0}};
  EXPECT_EQ(got, pytorch);
}

TEST(ReduceLROnPlateau, MatchesPyTorchInMaxAbsMode) {
  const auto got = steps({0.1, 0.3, 0.35, 0.3, 0.2, 0.2, 0.9, 0.9, 0.9},
                         ReduceLROnPlateauOptions().mode("max").patience(1).threshold(0.1).threshold_mode("abs"));
  const std::vector<double> pytorch{1.0, 1.0, 1.0, 0.1, 0.1, 0.010000000000000002, 0.010000000000000002,
                                    0.010000000000000002, 0.0010000000000000002};
  ASSERT_EQ(got.size(), pytorch.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_DOUBLE_EQ(got[i].first, pytorch[i]) << "step " << i;
}

TEST(ReduceLROnPlateau, StateRoundTripsAndBadOptionsAreRefused) {
  auto p = torch::zeros({1}, torch::requires_grad());
  torch::optim::SGD sgd({p}, torch::optim::SGDOptions(1.0));
  ReduceLROnPlateau a(sgd, ReduceLROnPlateauOptions().patience(3).cooldown(2));
  for (double m : {1.0, 0.5, 0.7, 0.8}) a.step(m);
  ReduceLROnPlateau b(sgd, ReduceLROnPlateauOptions().patience(3).cooldown(2));
  b.load_state_dict(a.state_dict());
  EXPECT_DOUBLE_EQ(b.best(), 0.5);
  EXPECT_EQ(b.num_bad_epochs(), 2);
  EXPECT_EQ(b.last_epoch(), 4);
  EXPECT_THROW(ReduceLROnPlateau(sgd, ReduceLROnPlateauOptions().factor(1.0)), UsageError);
  EXPECT_THROW(ReduceLROnPlateau(sgd, ReduceLROnPlateauOptions().mode("lowest")), UsageError);
  EXPECT_THROW(ReduceLROnPlateau(sgd, ReduceLROnPlateauOptions().threshold_mode("relative")), UsageError);
  EXPECT_THROW(ReduceLROnPlateau(sgd, ReduceLROnPlateauOptions().min_lrs({0.1, 0.2})), UsageError);
}

/// Logs `val_loss` = values[epoch] in validation; SGD(0.1) with a ReduceLROnPlateau on `monitor`.
struct Plateaued : testing::Regressor {
  Plateaued(std::vector<double> values, std::string monitor, bool strict = true)
      : values(std::move(values)), monitor(std::move(monitor)), strict(strict) {}
  void validation_step(Batch&, int64_t) override { log("val_loss", values.at(current_epoch())); }
  OptimizerConfig configure_optimizers() override {
    auto sgd = std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.1));
    OptimizerConfig config(sgd);
    auto plateau = std::make_shared<ReduceLROnPlateau>(*sgd, ReduceLROnPlateauOptions().factor(0.5).patience(2));
    config.schedulers.push_back({plateau, "epoch", monitor, strict});
    return config;
  }
  std::vector<double> values;
  std::string monitor;
  bool strict;
};

// PyTorch 1.13's ReduceLROnPlateau(factor=0.5, patience=2) on these values from lr 0.1 gives, after
// each step: 0.1 x5, then 0.05 (after the 6th: 0.7 three times not below 0.7), 0.05 x4, 0.025.
const std::vector<double> kValLoss{1.0, 0.8, 0.7, 0.7, 0.7, 0.7, 0.7, 0.69, 0.7, 0.7, 0.7};

class PlateauTrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    torch::set_num_threads(1);
    root = fs::temp_directory_path() / ("plateau_test_" + std::to_string(::getpid()));
    fs::remove_all(root);
  }
  void TearDown() override { fs::remove_all(root); }

  /// Fits `model` for `epochs` (2 steps each); returns the rate each epoch trained with.
  std::vector<double> fit(const std::shared_ptr<Plateaued>& model, int64_t epochs, const std::string& ckpt = "") {
    Trainer trainer(TrainerOptions()
                        .max_epochs(epochs)
                        .enable_progress_bar(false)
                        .num_sanity_val_steps(0)
                        .ckpt_path(ckpt)
                        .default_root_dir(root.string()));
    auto monitor = std::make_shared<LearningRateMonitor>();
    trainer.add_callback(monitor);
    trainer.add_callback(std::make_shared<ModelCheckpoint>(
        ModelCheckpointOptions().dirpath((root / "ckpts").string()).save_last(true)));
    trainer.fit(model, std::make_shared<DataLoader>(regression_data(32), DataLoaderOptions(16)),
                std::make_shared<DataLoader>(regression_data(16, 8, 9), DataLoaderOptions(16)));
    final_lr = trainer.optimizers()[0]->param_groups()[0].options().get_lr();
    return monitor->history().at("lr-SGD");
  }

  fs::path root;
  double final_lr = 0;
};

TEST_F(PlateauTrainerTest, CutsTheRateAfterPatienceEpochsAsPyTorch) {
  const auto lrs = fit(std::make_shared<Plateaued>(kValLoss, "val_loss"), 11);
  const std::vector<double> expected{0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.05, 0.05};
  EXPECT_EQ(lrs, expected);
  EXPECT_DOUBLE_EQ(final_lr, 0.025);
}

TEST_F(PlateauTrainerTest, ResumeGivesTheRatesOfAnUninterruptedRun) {
  // Stopped after epoch 4 with two bad epochs counted: the next one cuts. Lost counters (best
  // +inf again) would take 0.7 as an improvement and cut only at epoch 10's end.
  const auto first = fit(std::make_shared<Plateaued>(kValLoss, "val_loss"), 5);
  EXPECT_EQ(first, std::vector<double>(5, 0.1));
  const auto resumed = fit(std::make_shared<Plateaued>(kValLoss, "val_loss"), 11, (root / "ckpts" / "last.ckpt").string());
  EXPECT_EQ(resumed, (std::vector<double>{0.1, 0.05, 0.05, 0.05, 0.05, 0.05}));
  EXPECT_DOUBLE_EQ(final_lr, 0.025);
}

TEST_F(PlateauTrainerTest, AMissingMetricIsAnErrorNamingTheLoggedOnesUnlessNotStrict) {
  try {
    fit(std::make_shared<Plateaued>(kValLoss, "val_los"), 2);
    FAIL() << "expected a UsageError";
  } catch (const UsageError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("monitors 'val_los', which was not logged at the end of epoch 0; logged: train_loss, "
                           "val_loss."),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("strict = false"), std::string::npos) << message;
  }
  ::testing::internal::CaptureStderr();
  const auto lrs = fit(std::make_shared<Plateaued>(kValLoss, "val_los", false), 8);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(lrs, std::vector<double>(8, 0.1));  // never stepped
  size_t warnings = 0;
  for (size_t at = err.find("monitors 'val_los'"); at != std::string::npos; at = err.find("monitors 'val_los'", at + 1)) {
    ++warnings;
  }
  EXPECT_EQ(warnings, 1u) << err;
}

struct NoMonitor : testing::Regressor {
  explicit NoMonitor(bool plateau) : plateau(plateau) {}
  OptimizerConfig configure_optimizers() override {
    auto sgd = std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.1));
    OptimizerConfig config(sgd);
    if (plateau) {
      config.schedulers.push_back({std::make_shared<ReduceLROnPlateau>(*sgd), "epoch"});
    } else {
      config.schedulers.push_back({std::make_shared<torch::optim::StepLR>(*sgd, 1), "epoch", "val_loss"});
    }
    return config;
  }
  bool plateau;
};

TEST_F(PlateauTrainerTest, APlateauWithoutMonitorIsRefusedWithTheFix) {
  Trainer trainer(TrainerOptions().max_epochs(1).enable_progress_bar(false).enable_checkpointing(false)
                      .default_root_dir(root.string()));
  auto train = std::make_shared<DataLoader>(regression_data(32), DataLoaderOptions(16));
  try {
    trainer.fit(std::make_shared<NoMonitor>(true), train);
    FAIL() << "expected a UsageError";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("is a ReduceLROnPlateau without a metric to watch; name one it steps with, "
                                         "as Lightning's \"monitor\": {std::make_shared<lockstep::ReduceLROnPlateau>"
                                         "(*optimizer), \"epoch\", \"val_loss\"}."),
              std::string::npos)
        << e.what();
  }
  Trainer other(TrainerOptions().max_epochs(1).enable_progress_bar(false).enable_checkpointing(false)
                    .default_root_dir(root.string()));
  EXPECT_THROW(other.fit(std::make_shared<NoMonitor>(false), train), UsageError);
}

}  // namespace
}  // namespace reduce_lr_on_plateau_test
}  // namespace lockstep
