#pragma once
/// Which BLAS LibTorch's CPU matrix products run on, and a loud warning when it is the slow
/// reference implementation (Debian falls back to it when libopenblas0-pthread is missing).

#include <string>

namespace lockstep {
namespace core {

/// Real path of the shared library that provides `sgemm_` in this process, or "" if none.
std::string blas_library();

/// True for OpenBLAS, BLIS, MKL, ATLAS, and for a LibTorch that carries MKL (PyPI's builds);
/// false for the reference BLAS (libblas3) or none.
bool blas_is_optimized();

/// Prints one warning to stderr (once per process) when blas_is_optimized() is false, naming
/// the library found and the fix (`apt-get install libopenblas0-pthread`). Returns whether it
/// warned. Set LOCKSTEP_NO_BLAS_WARNING=1 to silence it.
bool warn_if_reference_blas();

}  // namespace core
}  // namespace lockstep
