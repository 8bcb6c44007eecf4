#pragma once
/// DeviceBusyError: fewer free CUDA devices than asked for.

#include <string>

#include <lockstep/core/error.h>

namespace lockstep {
namespace accelerators {

/// Fewer free CUDA devices than asked for, right now; select_gpu_ids retries on it.
class DeviceBusyError : public Error {
 public:
  explicit DeviceBusyError(const std::string& message) : Error(ErrorKind::environment, message) {}
};

}  // namespace accelerators
}  // namespace lockstep
