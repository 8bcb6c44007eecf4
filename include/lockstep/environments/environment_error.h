#pragma once
/// EnvironmentError: a scheduler's variables half-set or contradicting the options.

#include <string>

#include <lockstep/core/error.h>

namespace lockstep {
namespace environments {

/// Thrown for a half-set or contradictory environment; `what()` says what was wrong,
/// what was given and how to fix it. Binaries turn it into exit code 2.
class EnvironmentError : public Error {
 public:
  explicit EnvironmentError(const std::string& message) : Error(ErrorKind::environment, message) {}
};

}  // namespace environments
}  // namespace lockstep
