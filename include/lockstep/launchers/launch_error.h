#pragma once
/// LaunchError: a launch that is configured wrong or cannot start.

#include <string>

#include <lockstep/core/error.h>

namespace lockstep {
namespace launchers {

/// Thrown before any worker process starts: bad launch options, a program that does not exist or
/// cannot be executed, a launcher used in a process that cannot host it. `what()` says what was
/// wrong, what was given and how to fix it. Binaries turn it into exit code 2.
class LaunchError : public Error {
 public:
  explicit LaunchError(const std::string& message) : Error(ErrorKind::launch, message) {}
};

}  // namespace launchers
}  // namespace lockstep
