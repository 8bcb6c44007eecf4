#include <lockstep/plan/grad_scaler.h>

#include <cmath>
#include <limits>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <lockstep/core/error.h>

namespace lockstep {
namespace {

torch::Tensor parameter_with_grad(std::vector<float> grad) {
  auto p = torch::zeros({static_cast<int64_t>(grad.size())}, torch::requires_grad());
  p.mutable_grad() = torch::tensor(grad);
  return p;
}

TEST(GradScaler, ScalesTheLossAndUnscalesTheGradients) {
  GradScaler scaler(GradScalerOptions().init_scale(1024));
  EXPECT_EQ(scaler.scale(torch::tensor(0.5)).item<double>(), 512.0);
  auto a = parameter_with_grad({1024, -2048}), b = parameter_with_grad({512});
  auto no_grad = torch::zeros({1}, torch::requires_grad());  // unused in this step: skipped
  EXPECT_TRUE(scaler.unscale({a, no_grad, b}));
  EXPECT_TRUE(torch::equal(a.grad(), torch::tensor({1.0f, -2.0f})));
  EXPECT_TRUE(torch::equal(b.grad(), torch::tensor({0.5f})));
}

// backward() scales the loss; a watched parameter whose gradient came from a backward that skipped
// the scaling (a plain loss.backward()) makes unscale a UsageError naming the fix, where it would
// otherwise have divided true gradients by the scale.
TEST(GradScaler, AGradientThatSkippedTheScalingIsRefusedAtUnscale) {
  for (bool scaled : {true, false}) {
    GradScaler scaler(GradScalerOptions().init_scale(8));
    auto w = torch::full({2}, 3.0, torch::requires_grad());
    scaler.watch({w});
    const auto loss = (w * torch::tensor({1.0f, 2.0f})).sum();
    if (scaled) {
      scaler.backward(loss);
      EXPECT_TRUE(torch::equal(w.grad(), torch::tensor({8.0f, 16.0f})));
      EXPECT_TRUE(scaler.unscale({w}));
      EXPECT_TRUE(torch::equal(w.grad(), torch::tensor({1.0f, 2.0f})));
      continue;
    }
    loss.backward();
    try {
      scaler.unscale({w});
      ADD_FAILURE() << "an unscaled gradient was unscaled";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("fabric.backward(loss)"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(torch::equal(w.grad(), torch::tensor({1.0f, 2.0f}))) << "the gradients must be left as they were";
  }
}

// An inf or a NaN anywhere: the step is skipped and the scale halves; the count toward growth
// starts again.
TEST(GradScaler, AnInjectedInfOrNanHalvesTheScaleAndRestartsTheCount) {
  GradScaler scaler(GradScalerOptions().init_scale(65536).growth_interval(3));
  scaler.update(false);
  EXPECT_EQ(scaler.growth_tracker(), 1);
  for (float bad : {std::numeric_limits<float>::infinity(), std::nanf("")}) {
    auto finite = parameter_with_grad({1, 2}), broken = parameter_with_grad({3, bad});
    EXPECT_FALSE(scaler.unscale({finite, broken})) << bad;
    scaler.update(true);
    EXPECT_EQ(scaler.growth_tracker(), 0);
  }
  EXPECT_EQ(scaler.get_scale(), 16384.0);
}

TEST(GradScaler, GrowsAfterGrowthIntervalFiniteStepsInARow) {
  GradScaler scaler(GradScalerOptions().init_scale(8).growth_interval(3));
  scaler.update(false);
  scaler.update(false);
  EXPECT_EQ(scaler.get_scale(), 8.0);
  scaler.update(false);
  EXPECT_EQ(scaler.get_scale(), 16.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
  scaler.update(false);
  scaler.update(true);  // an overflow resets the count: two more finite steps do not grow it
  scaler.update(false);
  scaler.update(false);
  EXPECT_EQ(scaler.get_scale(), 8.0);
}

TEST(GradScaler, StateRoundTripsUnderPyTorchsKeys) {
  GradScaler scaler(GradScalerOptions().init_scale(4).growth_interval(10));
  scaler.update(true);
  scaler.update(false);
  const auto state = scaler.state_dict();
  EXPECT_EQ(state.at("scale").toDouble(), 2.0);
  EXPECT_EQ(state.at("_growth_tracker").toInt(), 1);
  EXPECT_EQ(state.at("growth_interval").toInt(), 10);
  GradScaler restored;
  restored.load_state_dict(state);
  EXPECT_EQ(restored.get_scale(), 2.0);
  EXPECT_EQ(restored.growth_tracker(), 1);
  auto broken = state.copy();
  ASSERT_EQ(broken.erase("_growth_tracker"), 1u);
  try {
    restored.load_state_dict(broken);
    ADD_FAILURE() << "a state without _growth_tracker was taken";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("\"_growth_tracker\""), std::string::npos) << e.what();
  }
}

TEST(GradScaler, OptionsOutsideTheirRangeAreRefused) {
  EXPECT_THROW(GradScaler(GradScalerOptions().init_scale(0)), UsageError);
  EXPECT_THROW(GradScaler(GradScalerOptions().growth_factor(1)), UsageError);
  EXPECT_THROW(GradScaler(GradScalerOptions().backoff_factor(1)), UsageError);
  EXPECT_THROW(GradScaler(GradScalerOptions().growth_interval(0)), UsageError);
}

}  // namespace
}  // namespace lockstep
