#include <lockstep/plan/precision.h>

#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <lockstep/core/error.h>
#include <lockstep/core/libtorch_compat.h>

namespace lockstep {
namespace {

TEST(Precision, NamesAndAliasesResolveOnce) {
  EXPECT_EQ(Precision().name(), "32-true");
  EXPECT_EQ(Precision::parse("32", accelerators::Accelerator::cpu).kind(), Precision::Kind::true_32);
  EXPECT_EQ(Precision::parse("64-true", accelerators::Accelerator::cpu).name(), "64-true");
  EXPECT_EQ(Precision::parse("bf16", accelerators::Accelerator::cpu).name(), "bf16-mixed");
  try {
    Precision::parse("8-true", accelerators::Accelerator::cpu);
    FAIL() << "8-true accepted";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()), "--precision '8-true' is unknown. Use 32-true, 64-true, bf16-mixed or 16-mixed.");
  }
  EXPECT_THROW(Precision::parse("16-mixed", accelerators::Accelerator::cpu), UsageError);
}

// bf16-mixed autocasts a matmul to bfloat16 inside a step's scope only, and restores the state.
TEST(Precision, Bf16MixedAutocastsInsideTheStepScopeOnly) {
  const auto a = torch::ones({2, 2}), b = torch::ones({2, 2});
  {
    Precision::StepScope scope(Precision::parse("bf16-mixed", accelerators::Accelerator::cpu));
    EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kBFloat16);
  }
  EXPECT_FALSE(at::autocast::is_cpu_enabled());
  EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kFloat32);
  Precision::StepScope inert(Precision::parse("32-true", accelerators::Accelerator::cpu));
  EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kFloat32);
}

bool cuda_autocast_enabled() { return libtorch::autocast_enabled(at::kCUDA); }

// On CUDA the scope turns CUDA autocast on (no GPU needed to see the flag) and leaves the CPU's
// alone; it restores what it found.
TEST(Precision, CudaMixedPrecisionAutocastsOnCudaOnly) {
  for (const char* name : {"16-mixed", "bf16-mixed"}) {
    {
      Precision::StepScope scope(Precision::parse(name, accelerators::Accelerator::cuda));
      EXPECT_TRUE(cuda_autocast_enabled()) << name;
      EXPECT_EQ(torch::mm(torch::ones({2, 2}), torch::ones({2, 2})).scalar_type(), torch::kFloat32) << name;
    }
    EXPECT_FALSE(cuda_autocast_enabled()) << name;
  }
  EXPECT_EQ(Precision::parse("16", accelerators::Accelerator::cuda).name(), "16-mixed");
}

TEST(Precision, SixtyFourTrueConvertsFloatingTensorsOnly) {
  Batch batch{torch::ones({2, 3}), torch::tensor({int64_t{1}, int64_t{0}})};
  Precision::parse("64", accelerators::Accelerator::cpu).convert_batch(batch);
  EXPECT_EQ(batch.data.scalar_type(), torch::kFloat64);
  EXPECT_EQ(batch.target.scalar_type(), torch::kInt64);
  torch::nn::Linear linear(3, 1);
  Precision::parse("64", accelerators::Accelerator::cpu).convert_module(*linear);
  EXPECT_EQ(linear->weight.scalar_type(), torch::kFloat64);
  Batch floats{torch::ones({1}), {}};
  Precision().convert_batch(floats);  // 32-true leaves them as they are
  EXPECT_EQ(floats.data.scalar_type(), torch::kFloat32);
}

}  // namespace
}  // namespace lockstep
