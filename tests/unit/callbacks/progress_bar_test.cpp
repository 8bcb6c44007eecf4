#include <lockstep/callbacks/progress_bar.h>

#include <unistd.h>

#include <filesystem>
#include <sstream>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <lockstep/callbacks/metric_format.h>
#include <lockstep/trainer/trainer.h>

#include "../../support/regression.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;
using testing::regression_data;

class ProgressBarTest : public ::testing::Test {
 protected:
  void SetUp() override {
    torch::set_num_threads(1);
    root = fs::temp_directory_path() / ("progress_bar_test_" + std::to_string(::getpid()));
    fs::remove_all(root);
  }
  void TearDown() override { fs::remove_all(root); }

  // Each epoch's training losses, as training_step returned them.
  struct Losses : Callback {
    std::string name() const override { return "Losses"; }
    void on_train_batch_end(TrainerView& trainer, TrainingModule&, const torch::Tensor& loss, int64_t) override {
      of_epoch.resize(static_cast<size_t>(trainer.current_epoch() + 1));
      of_epoch.back().push_back(loss.item<double>());
    }
    std::vector<std::vector<double>> of_epoch;
  };

  /// Fits 2 epochs of 10 training batches and 1 validation batch with `bar`; returns stderr.
  std::string fit_with(const std::shared_ptr<ProgressBar>& bar) {
    trainer = std::make_unique<Trainer>(TrainerOptions()
                                            .max_epochs(2)
                                            .enable_progress_bar(false)
                                            .enable_checkpointing(false)
                                            .num_sanity_val_steps(1)
                                            .log_every_n_steps(1)
                                            .default_root_dir(root.string()));
    trainer->add_callback(bar);
    trainer->add_callback(losses);
    ::testing::internal::CaptureStderr();
    trainer->fit(std::make_shared<testing::Regressor>(),
                 std::make_shared<DataLoader>(regression_data(160), DataLoaderOptions(16)),
                 std::make_shared<DataLoader>(regression_data(16, 8, 9), DataLoaderOptions(16)));
    return ::testing::internal::GetCapturedStderr();
  }

  /// Lines starting with `prefix`.
  static std::vector<std::string> lines(const std::string& text, const std::string& prefix) {
    std::vector<std::string> found;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
      if (line.rfind(prefix, 0) == 0) found.push_back(line);
    }
    return found;
  }

  fs::path root;
  std::unique_ptr<Trainer> trainer;
  std::shared_ptr<Losses> losses = std::make_shared<Losses>();
};

TEST_F(ProgressBarTest, PlainLinesEveryPercentAndOneSummaryPerEpoch) {
  const std::string out = fit_with(std::make_shared<ProgressBar>(ProgressBarOptions().live(false).print_every_percent(50)));
  EXPECT_EQ(out.find('\r'), std::string::npos) << out;
  const auto epoch0 = lines(out, "Epoch 0");
  ASSERT_EQ(epoch0.size(), 3u) << out;
  EXPECT_EQ(epoch0[0].rfind("Epoch 0:  50% 5/10 [", 0), 0u) << epoch0[0];
  EXPECT_NE(epoch0[0].find("it/s, train_loss="), std::string::npos) << epoch0[0];
  EXPECT_EQ(epoch0[1].rfind("Epoch 0: 100% 10/10 [", 0), 0u) << epoch0[1];
  EXPECT_EQ(epoch0[2].rfind("Epoch 0 done: 10 batches in 00:00 (", 0), 0u) << epoch0[2];
  const auto epoch1 = lines(out, "Epoch 1");
  ASSERT_EQ(epoch1.size(), 3u) << out;
  // The last summary shows the epoch's metrics as they are at the end of fit, train_loss (logged
  // on_step only) as its mean over the epoch's 10 batches of 16, not its last step's value.
  const auto& metrics = trainer->callback_metrics();
  const std::string val_loss = "val_loss=" + detail::short_number(metrics.at("val_loss"));
  ASSERT_EQ(losses->of_epoch.size(), 2u);
  const auto& epoch_losses = losses->of_epoch[1];
  ASSERT_EQ(epoch_losses.size(), 10u);
  double mean = 0;
  for (double loss : epoch_losses) mean += loss / 10;
  EXPECT_NEAR(trainer->train_epoch_means().at("train_loss"), mean, 1e-6);
  EXPECT_DOUBLE_EQ(metrics.at("train_loss"), epoch_losses.back()) << "callbacks still monitor the last step's";
  const std::string train_loss = "train_loss=" + detail::short_number(mean);
  ASSERT_NE(train_loss, "train_loss=" + detail::short_number(epoch_losses.back())) << "a mean that could not fail";
  EXPECT_NE(epoch1[2].find("; " + train_loss + ", " + val_loss), std::string::npos) << epoch1[2] << " vs " << train_loss;
  EXPECT_EQ(epoch1[2].substr(epoch1[2].size() - val_loss.size()), val_loss);
}

TEST_F(ProgressBarTest, PlainLinesEveryNBatches) {
  const std::string out = fit_with(std::make_shared<ProgressBar>(ProgressBarOptions().live(false).print_every_n_batches(4)));
  const auto epoch1 = lines(out, "Epoch 1:");
  ASSERT_EQ(epoch1.size(), 3u) << out;
  EXPECT_EQ(epoch1[0].rfind("Epoch 1:  40% 4/10 [", 0), 0u) << epoch1[0];
  EXPECT_EQ(epoch1[1].rfind("Epoch 1:  80% 8/10 [", 0), 0u) << epoch1[1];
  EXPECT_EQ(epoch1[2].rfind("Epoch 1: 100% 10/10 [", 0), 0u) << epoch1[2];
}

TEST_F(ProgressBarTest, LiveBarRedrawsInPlace) {
  const std::string out = fit_with(std::make_shared<ProgressBar>(ProgressBarOptions().live(true).refresh_seconds(0)));
  // Every batch redraws the line with '\r'; each epoch ends it with one newline.
  EXPECT_NE(out.find("\rEpoch 0:  10%|##                  | 1/10 [00:00<00:"), std::string::npos) << out;
  EXPECT_NE(out.find("\rEpoch 0:  50%|##########          | 5/10 [00:00<00:"), std::string::npos) << out;
  EXPECT_NE(out.find("\rValidation: 100%|####################| 1/1 [00:00, "), std::string::npos) << out;
  size_t line_ends = 0;
  for (size_t at = out.find("]\n"); at != std::string::npos; at = out.find("]\n", at + 1)) ++line_ends;
  EXPECT_EQ(line_ends, 2u) << out;
  // The line that ends epoch 1 carries its metrics, validation included.
  const std::string val_loss = "val_loss=" + detail::short_number(trainer->callback_metrics().at("val_loss"));
  const size_t last = out.rfind("\rEpoch 1: 100%|####################| 10/10 [00:00, ");
  ASSERT_NE(last, std::string::npos) << out;
  EXPECT_EQ(out.find(val_loss + "]\n", last), out.size() - val_loss.size() - 2) << out.substr(last);
  EXPECT_EQ(out.find("done:"), std::string::npos) << out;
  EXPECT_EQ(out.find("\rEpoch 0: 100%|####################| 10/10 [00:00<"), std::string::npos)
      << "no ETA once an epoch is complete";
  ProgressBar automatic;
  EXPECT_EQ(automatic.live(), ::isatty(STDERR_FILENO) == 1);
}

TEST_F(ProgressBarTest, ValidateAlonePrintsItsResults) {
  Trainer alone(TrainerOptions().enable_progress_bar(false).default_root_dir(root.string()));
  alone.add_callback(std::make_shared<ProgressBar>(ProgressBarOptions().live(false)));
  ::testing::internal::CaptureStderr();
  const auto metrics = alone.validate(std::make_shared<testing::Regressor>(),
                                      std::make_shared<DataLoader>(regression_data(48), DataLoaderOptions(16)));
  const std::string out = ::testing::internal::GetCapturedStderr();
  const auto found = lines(out, "Validation done: 3 batches in 00:00; ");
  ASSERT_EQ(found.size(), 1u) << out;
  EXPECT_EQ(found[0], "Validation done: 3 batches in 00:00; val_loss=" + detail::short_number(metrics.at("val_loss")));
}

TEST(MetricFormatTest, ShortNumbersAsTqdm) {
  EXPECT_EQ(detail::short_number(0.123456), "0.123");
  EXPECT_EQ(detail::short_number(12.345), "12.3");
  EXPECT_EQ(detail::short_number(1.23456e-5), "1.23e-5");
  EXPECT_EQ(detail::short_number(2.0), "2");
  EXPECT_EQ(detail::python_float(0.1), "0.1");
  EXPECT_EQ(detail::python_float(100.0), "100.0");
  EXPECT_EQ(detail::python_float(1e-5), "1e-05");
  EXPECT_EQ(detail::python_float(1.5e-5), "1.5e-05");
  EXPECT_EQ(detail::python_float(0.0001), "0.0001");
  EXPECT_EQ(detail::python_float(1e16), "1e+16");
  EXPECT_EQ(detail::python_float(123456789.125), "123456789.125");
  EXPECT_EQ(detail::python_float(-0.5), "-0.5");
  EXPECT_EQ(detail::python_float(0.12345), "0.12345");
}

}  // namespace
}  // namespace lockstep
