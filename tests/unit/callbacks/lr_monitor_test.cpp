#include <lockstep/callbacks/lr_monitor.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <lockstep/core/error.h>
#include <lockstep/trainer/trainer.h>

#include "../../support/regression.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;
using testing::regression_data;

/// SGD(lr 0.1, momentum 0.9) with StepLR(step_size, gamma 0.5) stepping per `interval`.
struct Scheduled : testing::Regressor {
  Scheduled(std::string interval, int64_t step_size) : interval(std::move(interval)), step_size(step_size) {}
  OptimizerConfig configure_optimizers() override {
    auto sgd = std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    OptimizerConfig config(sgd);
    config.schedulers.push_back({std::make_shared<torch::optim::StepLR>(*sgd, step_size, 0.5), interval});
    return config;
  }
  std::string interval;
  int64_t step_size;
};

/// Two Adams, the first with two parameter groups.
struct TwoAdams : testing::Regressor {
  OptimizerConfig configure_optimizers() override {
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(fc1->parameters(), std::make_unique<torch::optim::AdamOptions>(1e-3));
    groups.emplace_back(fc2->parameters(), std::make_unique<torch::optim::AdamOptions>(1e-4));
    OptimizerConfig config;
    config.optimizers.push_back(std::make_shared<torch::optim::Adam>(groups));
    config.optimizers.push_back(
        std::make_shared<torch::optim::Adam>(fc2->parameters(), torch::optim::AdamOptions(2e-3).betas({0.8, 0.99})));
    return config;
  }
};

class LearningRateMonitorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    torch::set_num_threads(1);
    root = fs::temp_directory_path() / ("lr_monitor_test_" + std::to_string(::getpid()));
    fs::remove_all(root);
  }
  void TearDown() override { fs::remove_all(root); }

  // 3 epochs of 2 optimizer steps.
  std::unique_ptr<Trainer> fit(const std::shared_ptr<TrainingModule>& model,
                               const std::shared_ptr<LearningRateMonitor>& monitor, int64_t log_every = 50) {
    auto trainer = std::make_unique<Trainer>(TrainerOptions()
                                                 .max_epochs(3)
                                                 .enable_progress_bar(false)
                                                 .enable_checkpointing(false)
                                                 .log_every_n_steps(log_every)
                                                 .default_root_dir(root.string()));
    trainer->add_callback(monitor);
    trainer->fit(model, std::make_shared<DataLoader>(regression_data(32), DataLoaderOptions(16)));
    return trainer;
  }

  fs::path root;
};

TEST_F(LearningRateMonitorTest, LogsEachEpochsRateWithStepLR) {
  auto monitor = std::make_shared<LearningRateMonitor>();
  auto trainer = fit(std::make_shared<Scheduled>("epoch", 1), monitor);
  EXPECT_EQ(monitor->names(), std::vector<std::string>{"lr-SGD"});
  ASSERT_EQ(monitor->history().count("lr-SGD"), 1u);
  // LibTorch's StepLR does not decay on its first step() (Python's constructor takes that step).
  EXPECT_EQ(monitor->history().at("lr-SGD"), (std::vector<double>{0.1, 0.1, 0.05}));

  // Written to metrics.csv at each epoch's first step: 0, 2, 4.
  std::ifstream csv(fs::path(trainer->log_dir()) / "metrics.csv");
  std::string header;
  std::getline(csv, header);
  EXPECT_NE(header.find("lr-SGD"), std::string::npos) << header;
  std::string all((std::istreambuf_iterator<char>(csv)), std::istreambuf_iterator<char>());
  EXPECT_NE(all.find("0.05"), std::string::npos) << all;
}

TEST_F(LearningRateMonitorTest, LogsTheRateEachStepUsedWithAStepScheduler) {
  auto monitor = std::make_shared<LearningRateMonitor>(LearningRateMonitorOptions().log_momentum(true));
  fit(std::make_shared<Scheduled>("step", 2), monitor, 1);
  // The scheduler is per step, so the unset interval logs per step: the rate each step used,
  // halved by every 2nd scheduler step after the first.
  EXPECT_EQ(monitor->history().at("lr-SGD"), (std::vector<double>{0.1, 0.1, 0.1, 0.05, 0.05, 0.025}));
  EXPECT_EQ(monitor->history().at("lr-SGD-momentum"), std::vector<double>(6, 0.9));

  auto every_other = std::make_shared<LearningRateMonitor>(LearningRateMonitorOptions().logging_interval("step"));
  fit(std::make_shared<Scheduled>("step", 2), every_other, 2);
  // log_every_n_steps 2: the 2nd, 4th and 6th steps.
  EXPECT_EQ(every_other->history().at("lr-SGD"), (std::vector<double>{0.1, 0.05, 0.025}));
  EXPECT_EQ(every_other->history().count("lr-SGD-momentum"), 0u);
}

TEST_F(LearningRateMonitorTest, NamesGroupsAndRepeatedOptimizersAsLightning) {
  auto monitor = std::make_shared<LearningRateMonitor>(
      LearningRateMonitorOptions().logging_interval("epoch").log_momentum(true).log_weight_decay(true));
  fit(std::make_shared<TwoAdams>(), monitor);
  EXPECT_EQ(monitor->names(), (std::vector<std::string>{"lr-Adam/pg1", "lr-Adam/pg2", "lr-Adam-1"}));
  const auto& h = monitor->history();
  EXPECT_EQ(h.at("lr-Adam/pg1"), std::vector<double>(3, 1e-3));
  EXPECT_EQ(h.at("lr-Adam/pg2"), std::vector<double>(3, 1e-4));
  EXPECT_EQ(h.at("lr-Adam-1"), std::vector<double>(3, 2e-3));
  EXPECT_EQ(h.at("lr-Adam-1-momentum"), std::vector<double>(3, 0.8));
  EXPECT_EQ(h.at("lr-Adam/pg1-weight_decay"), std::vector<double>(3, 0.0));
  EXPECT_EQ(h.size(), 9u);
  EXPECT_THROW(LearningRateMonitor(LearningRateMonitorOptions().logging_interval("batch")), UsageError);
}

}  // namespace
}  // namespace lockstep
