// Weights that do not fit the module: the Trainer's message names a flag that exists (and the fix
// it names works), and a fit that fails before it writes anything leaves no empty version_N.
#include <lockstep/trainer/trainer.h>

#include <filesystem>
#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <lockstep/core/error.h>

#include "../../support/trainer_runs.h"

namespace lockstep {
namespace trainer_weights_mismatch_test {

// The regression model with one more layer, "extra": its names are missing from the checkpoint.
struct Extended : testing::Regressor {
  Extended() { extra = register_module("extra", torch::nn::Linear(1, 1)); }
  torch::Tensor training_step(Batch& batch, int64_t) override {
    return torch::mse_loss(extra(forward(batch.data)), batch.target);
  }
  torch::nn::Linear extra{nullptr};
};

// The regression model with its second layer named "head": a prefix explains the names.
struct Renamed : TrainingModule {
  Renamed() {
    fc1 = register_module("fc1", torch::nn::Linear(8, 16));
    head = register_module("head", torch::nn::Linear(16, 1));
  }
  torch::Tensor training_step(Batch& batch, int64_t) override {
    return torch::mse_loss(head(torch::relu(fc1(batch.data))), batch.target);
  }
  OptimizerConfig configure_optimizers() override {
    return std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.05));
  }
  torch::nn::Linear fc1{nullptr}, head{nullptr};
};

std::string usage_error_of(Trainer& trainer, const std::shared_ptr<TrainingModule>& model) {
  try {
    trainer.fit(model, testing::loader_of(testing::regression_data(16), 8));
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

}  // namespace trainer_weights_mismatch_test

namespace {

using namespace trainer_weights_mismatch_test;
namespace fs = std::filesystem;

// Names that differ: a resume is refused, naming the --init-weights flags that start a new run
// from the weights, and the one it names for missing names works: it loads fc1 and fc2 and leaves
// "extra" as it was.
TEST(TrainerWeightsMismatch, ACheckpointWithOtherNamesNamesTheInitWeightsFlagsThatLoadIt) {
  testing::TempDir dir("lockstep_mismatch_names");
  Trainer first(testing::quiet_options(dir).max_epochs(1));
  first.fit(std::make_shared<testing::Regressor>(), testing::loader_of(testing::regression_data(16), 8));
  const std::string ckpt = (fs::path(dir.path()) / "saved.ckpt").string();
  first.save_checkpoint(ckpt);

  Trainer resume(testing::quiet_options(dir).max_epochs(2).ckpt_path(ckpt));
  std::string error = usage_error_of(resume, std::make_shared<Extended>());
  EXPECT_NE(error.find("--ckpt-path " + ckpt + ": the checkpoint does not match the model (missing keys: "
                       "extra.weight, extra.bias)"),
            std::string::npos) << error;
  EXPECT_NE(error.find("--init-weights " + ckpt + " --init-weights-strict false"), std::string::npos) << error;
  EXPECT_EQ(error.find("strict=false"), std::string::npos) << error;
  Trainer renamed(testing::quiet_options(dir).max_epochs(2).ckpt_path(ckpt));
  error = usage_error_of(renamed, std::make_shared<Renamed>());
  EXPECT_NE(error.find("--init-weights " + ckpt + " --init-weights-rename 'fc2.=head.'"), std::string::npos) << error;

  auto extended = std::make_shared<Extended>();
  const auto extra_before = extended->extra->weight.clone();
  Trainer start(testing::quiet_options(dir).max_epochs(1).limit_train_batches(0).init_weights(ckpt).init_weights_strict(false));
  ::testing::internal::CaptureStderr();
  start.fit(extended, testing::loader_of(testing::regression_data(16), 8));
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(torch::equal(extended->fc1->weight, dynamic_cast<testing::Regressor&>(*first.module()).fc1->weight));
  EXPECT_TRUE(torch::equal(extended->extra->weight, extra_before));
  EXPECT_NE(err.find("--init-weights-strict false left 2 of the module's names at their initial values and skipped 0"),
            std::string::npos) << err;
}

// A fit that fails after its logger made version_N, before anything is written there, removes
// the folder; a run that wrote into it keeps it.
TEST(TrainerWeightsMismatch, AFitThatFailsBeforeWritingLeavesNoEmptyRunFolder) {
  testing::TempDir dir("lockstep_empty_run");
  const fs::path runs = fs::path(dir.path()) / "lockstep_logs";
  Trainer failing(testing::quiet_options(dir).max_epochs(1).val_check_interval(9));
  const std::string error = usage_error_of(failing, std::make_shared<testing::Regressor>());
  EXPECT_NE(error.find("--val-check-interval 9 but a training epoch has only 2 batch(es)"), std::string::npos) << error;
  EXPECT_TRUE(fs::is_directory(runs)) << "the logger made no folder: the test shows nothing";
  EXPECT_FALSE(fs::exists(runs / "version_0")) << "an empty run folder was left behind";
  Trainer fine(testing::quiet_options(dir).max_epochs(1));
  fine.fit(std::make_shared<testing::Regressor>(), testing::loader_of(testing::regression_data(16), 8));
  EXPECT_TRUE(fs::exists(runs / "version_0" / "metrics.csv"));
}

}  // namespace
}  // namespace lockstep
