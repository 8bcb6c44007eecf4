#pragma once
/// The errors of the distributed layer, in a header of their own so that catching them needs no
/// LibTorch header.

#include <string>
#include <utility>
#include <vector>

#include <lockstep/core/error.h>

namespace lockstep {
namespace distributed {

/// A blocking distributed call that did not complete: it names the operation, the rank and
/// the timeout, and says what to check.
class DistributedError : public Error {
 public:
  explicit DistributedError(const std::string& message) : Error(ErrorKind::distributed, message) {}
};

/// What backward throws when find_unused_parameters is off and some parameters received no
/// gradient (PyTorch's "Expected to have finished reduction ..." error), with their names.
class UnusedParametersError : public DistributedError {
 public:
  UnusedParametersError(const std::string& message, std::vector<std::string> parameter_names)
      : DistributedError(message), parameter_names_(std::move(parameter_names)) {}
  const std::vector<std::string>& parameter_names() const { return parameter_names_; }

 private:
  std::vector<std::string> parameter_names_;
};

}  // namespace distributed
}  // namespace lockstep
