#include <lockstep/core/blas.h>

#include <cstdlib>

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace lockstep {
namespace core {
namespace {

TEST(Blas, FindsTheLibraryThatAnswersSgemm) {
  // LibTorch links libblas.so.3; whichever alternative provides it must be named.
  const std::string path = blas_library();
  ASSERT_FALSE(path.empty());
  // PyPI's LibTorch carries MKL inside libtorch_cpu.so instead.
  EXPECT_NE(path.find(at::hasMKL() ? "libtorch_cpu" : "blas"), std::string::npos) << path;
}

TEST(Blas, OpenBlasIsRecognisedAsOptimised) {
  // scripts/setup installs libopenblas0-pthread, so this machine must use it, unless LibTorch
  // carries MKL (PyPI's builds), which counts as optimised.
  const std::string path = blas_library();
  EXPECT_NE(path.find(at::hasMKL() ? "libtorch_cpu" : "openblas"), std::string::npos) << path;
  EXPECT_TRUE(blas_is_optimized()) << path;
  EXPECT_FALSE(warn_if_reference_blas());
}

}  // namespace
}  // namespace core
}  // namespace lockstep
