#include <lockstep/core/blas.h>

#include <dlfcn.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <iostream>

#include <ATen/Context.h>

namespace lockstep {
namespace core {

std::string blas_library() {
  // LibTorch links libblas.so.3, which Debian's alternatives point at OpenBLAS, BLIS or the
  // reference BLAS; the library that answers for sgemm_ is the one in use.
  void* symbol = dlsym(RTLD_DEFAULT, "sgemm_");
  Dl_info info{};
  if (symbol == nullptr || dladdr(symbol, &info) == 0 || info.dli_fname == nullptr) return "";
  std::error_code error;
  const auto real = std::filesystem::canonical(info.dli_fname, error);
  return error ? std::string(info.dli_fname) : real.string();
}

bool blas_is_optimized() {
  if (at::hasMKL()) return true;  // PyPI's LibTorch: MKL inside libtorch_cpu.so answers sgemm_
  const std::string path = blas_library();
  static const std::array<const char*, 5> fast{"openblas", "blis", "mkl", "atlas", "accelerate"};
  for (const char* name : fast) {
    if (path.find(name) != std::string::npos) return true;
  }
  return false;
}

bool warn_if_reference_blas() {
  static std::atomic<bool> warned{false};
  const char* quiet = std::getenv("LOCKSTEP_NO_BLAS_WARNING");
  if ((quiet != nullptr && std::string(quiet) == "1") || blas_is_optimized() || warned.exchange(true)) {
    return false;
  }
  const std::string path = blas_library();
  std::cerr << "lockstep: WARNING: LibTorch is using the reference BLAS ("
            << (path.empty() ? "no sgemm_ found" : path)
            << "), which is about 25x slower for matrix products.\n"
               "lockstep: fix: apt-get install libopenblas0-pthread (scripts/setup does it)\n";
  return true;
}

}  // namespace core
}  // namespace lockstep
