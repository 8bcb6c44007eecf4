// The LibTorch-version seam (core/libtorch_compat.h) against the LibTorch this build uses: each
// name does what its callers rely on, whichever line compiled it.
#include <lockstep/core/libtorch_compat.h>

#include <string>
#include <type_traits>

#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/torch.h>

namespace lockstep {
namespace libtorch_compat_test {
namespace {

TEST(LibTorchCompat, BackendIsWhatGlooDerivesFrom) {
  static_assert(std::is_base_of_v<libtorch::Backend, c10d::ProcessGroupGloo>, "Gloo is a Backend");
  const std::string name = libtorch::kNcclAsyncErrorHandling;
  EXPECT_TRUE(name == "NCCL_ASYNC_ERROR_HANDLING" || name == "TORCH_NCCL_ASYNC_ERROR_HANDLING") << name;
}

// The key finds a parameter's state after a step, and the accumulator held is the one autograd
// uses; restored after set_data to another dtype, the parameter has the same one again.
TEST(LibTorchCompat, OptimizerStateKeyAndGradAccumulator) {
  auto weight = torch::ones({3}, torch::requires_grad());
  torch::optim::Adam adam({weight});
  (weight * 2).sum().backward();
  adam.step();
  EXPECT_EQ(adam.state().count(libtorch::optimizer_state_key<torch::optim::Adam>(weight)), 1u);

  libtorch::GradAccumulator held = torch::autograd::impl::grad_accumulator(weight);
  EXPECT_EQ(torch::autograd::impl::grad_accumulator(weight).get(), held.get());
  {
    torch::NoGradGuard no_grad;
    weight.set_data(torch::zeros({3}, torch::kFloat64));
  }
  libtorch::restore_grad_accumulator(weight, held);
  EXPECT_EQ(torch::autograd::impl::grad_accumulator(weight).get(), held.get());
}

TEST(LibTorchCompat, AutocastPerDeviceTypeRoundTrips) {
  const bool enabled = libtorch::autocast_enabled(c10::kCPU);
  const auto dtype = libtorch::autocast_dtype(c10::kCPU);
  libtorch::set_autocast(c10::kCPU, true, c10::kBFloat16);
  EXPECT_TRUE(libtorch::autocast_enabled(c10::kCPU));
  EXPECT_EQ(libtorch::autocast_dtype(c10::kCPU), c10::kBFloat16);
  EXPECT_FALSE(libtorch::autocast_enabled(c10::kCUDA));
  libtorch::set_autocast(c10::kCPU, enabled, dtype);
  EXPECT_EQ(libtorch::autocast_enabled(c10::kCPU), enabled);
  EXPECT_EQ(libtorch::autocast_dtype(c10::kCPU), dtype);
}

}  // namespace
}  // namespace libtorch_compat_test
}  // namespace lockstep
