// What the Trainer computes, in numbers: precision (bf16-mixed CPU autocast, 64-true) and
// gradient clipping (norm and value) against hand-written LibTorch loops.
#include <lockstep/trainer/trainer.h>

#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../../support/trainer_runs.h"

namespace lockstep {
namespace {

using testing::loader_of;
using testing::max_abs_diff;
using testing::regression_data;

/// Records the dtypes a step sees and the loss of every training step.
struct DtypeRecorder : testing::Regressor {
  torch::Tensor training_step(Batch& batch, int64_t) override {
    auto out = forward(batch.data);
    output = out.scalar_type();
    weight = fc1->weight.scalar_type();
    data = batch.data.scalar_type();
    target = batch.target.scalar_type();
    autocast = at::autocast::is_cpu_enabled();
    auto loss = torch::mse_loss(out, batch.target);
    losses.push_back(loss.item<double>());
    return loss;
  }
  void validation_step(Batch& batch, int64_t) override { val_output = forward(batch.data).scalar_type(); }
  torch::Tensor predict_step(Batch& batch, int64_t) override { return forward(batch.data); }
  at::ScalarType output = at::kChar, weight = at::kChar, data = at::kChar, target = at::kChar,
                 val_output = at::kChar;
  bool autocast = false;
  std::vector<double> losses;
};

class TrainerNumerics : public ::testing::Test {
 protected:
  void SetUp() override { torch::set_num_threads(1); }
  /// Fits a DtypeRecorder (initialised from seed 1) for 2 epochs of 4 batches.
  std::shared_ptr<DtypeRecorder> fit(TrainerOptions o) {
    torch::manual_seed(1);
    auto model = std::make_shared<DtypeRecorder>();
    Trainer trainer(o.max_epochs(2));
    trainer.fit(model, loader_of(data, 16), loader_of(regression_data(16, 8, 9), 16));
    return model;
  }
  testing::TempDir dir{"trainer_numerics"};
  std::shared_ptr<TensorDataset> data = regression_data(64);
};

TEST_F(TrainerNumerics, Bf16MixedRunsStepsInBfloat16AndKeepsFloat32Parameters) {
  auto full = fit(testing::quiet_options(dir));
  auto mixed = fit(testing::quiet_options(dir).precision("bf16-mixed"));
  EXPECT_EQ(full->output, at::kFloat);
  EXPECT_FALSE(full->autocast);

  EXPECT_TRUE(mixed->autocast);
  EXPECT_EQ(mixed->output, at::kBFloat16) << "a Linear under CPU autocast";
  EXPECT_EQ(mixed->val_output, at::kBFloat16) << "validation steps are autocast too";
  EXPECT_EQ(mixed->weight, at::kFloat);
  EXPECT_EQ(mixed->data, at::kFloat);
  for (const auto& p : mixed->parameters()) EXPECT_EQ(p.scalar_type(), at::kFloat);
  // Outside the steps autocast is off again.
  EXPECT_FALSE(at::autocast::is_cpu_enabled());
  EXPECT_EQ(mixed->forward(torch::randn({2, 8})).scalar_type(), at::kFloat);

  ASSERT_EQ(mixed->losses.size(), 8u);
  ASSERT_EQ(full->losses.size(), 8u);
  for (size_t i = 0; i < full->losses.size(); ++i) {
    EXPECT_NEAR(mixed->losses[i], full->losses[i], 0.03 * full->losses[i] + 1e-3) << "step " << i;
  }
  const double drift = max_abs_diff(*mixed, *full);
  EXPECT_GT(drift, 0.0) << "bf16 rounding must show: autocast did not run";
  EXPECT_LT(drift, 0.02);
}

TEST_F(TrainerNumerics, SixtyFourTrueEqualsAFloat64HandLoop) {
  auto model = fit(testing::quiet_options(dir).precision("64-true"));
  EXPECT_EQ(model->weight, at::kDouble);
  EXPECT_EQ(model->data, at::kDouble);
  EXPECT_EQ(model->target, at::kDouble);
  EXPECT_EQ(model->output, at::kDouble);
  EXPECT_EQ(model->val_output, at::kDouble);
  EXPECT_FALSE(model->autocast);

  torch::manual_seed(1);
  testing::Regressor reference;
  reference.to(torch::kFloat64);
  auto optimizer = reference.configure_optimizers().optimizers[0];
  DataLoader loader(data, DataLoaderOptions(16));
  for (int epoch = 0; epoch < 2; ++epoch) {
    for (int64_t i = 0; i < loader.num_batches(); ++i) {
      Batch b = loader.batch(i);
      auto loss = torch::mse_loss(reference.forward(b.data.to(torch::kFloat64)), b.target.to(torch::kFloat64));
      loss.backward();
      optimizer->step();
      optimizer->zero_grad();
    }
  }
  for (const auto& p : model->parameters()) ASSERT_EQ(p.scalar_type(), at::kDouble);
  EXPECT_EQ(max_abs_diff(*model, reference), 0.0);
}

TEST_F(TrainerNumerics, PredictFollowsThePrecision) {
  torch::manual_seed(1);
  auto model = std::make_shared<DtypeRecorder>();
  Trainer trainer(testing::quiet_options(dir).precision("64-true"));
  const auto outputs = trainer.predict(model, loader_of(data, 32));
  ASSERT_EQ(outputs.size(), 2u);
  EXPECT_EQ(outputs[0].scalar_type(), at::kDouble);
}

/// `steps` SGD steps on batches of 16, clipping each gradient as the Trainer should.
void hand_loop_with_clipping(testing::Regressor& model, Dataset& data, int steps, const std::string& algorithm,
                             double clip, bool& clipping_was_active) {
  auto optimizer = model.configure_optimizers().optimizers[0];
  DataLoader loader(std::shared_ptr<Dataset>(&data, [](Dataset*) {}), DataLoaderOptions(16));
  for (int i = 0; i < steps; ++i) {
    Batch b = loader.batch(i);
    torch::mse_loss(model.forward(b.data), b.target).backward();
    if (algorithm == "norm") {
      clipping_was_active |= torch::nn::utils::clip_grad_norm_(model.parameters(), clip) > clip;
    } else if (algorithm == "value") {
      for (const auto& p : model.parameters()) clipping_was_active |= p.grad().abs().max().item<double>() > clip;
      torch::nn::utils::clip_grad_value_(model.parameters(), clip);
    }
    optimizer->step();
    optimizer->zero_grad();
  }
}

TEST_F(TrainerNumerics, GradientClippingEqualsClipGradNormAndValue) {
  const double clip = 0.05;
  for (const std::string algorithm : {"norm", "value"}) {
    for (int steps : {1, 3}) {
      torch::manual_seed(3);
      auto model = std::make_shared<testing::Regressor>();
      Trainer trainer(testing::quiet_options(dir)
                          .max_epochs(1)
                          .limit_train_batches(steps)
                          .gradient_clip_val(clip)
                          .gradient_clip_algorithm(algorithm));
      trainer.fit(model, loader_of(data, 16));
      ASSERT_EQ(trainer.global_step(), steps);

      torch::manual_seed(3);
      testing::Regressor clipped;
      bool active = false;
      hand_loop_with_clipping(clipped, *data, steps, algorithm, clip, active);
      ASSERT_TRUE(active) << algorithm << ": the test needs gradients beyond " << clip;
      torch::manual_seed(3);
      testing::Regressor unclipped;
      bool ignored = false;
      hand_loop_with_clipping(unclipped, *data, steps, "none", clip, ignored);

      EXPECT_EQ(max_abs_diff(*model, clipped), 0.0) << algorithm << ", " << steps << " step(s)";
      EXPECT_GT(max_abs_diff(*model, unclipped), 0.0) << algorithm << ": clipping had no effect";
    }
  }
}

}  // namespace
}  // namespace lockstep
