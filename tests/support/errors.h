#pragma once
// The message of the error a call throws, for tests of error texts.

#include <functional>
#include <string>

#include <lockstep/core/error.h>

namespace lockstep {
namespace testing {

/// What `fn` throws as an `Error` (default UsageError), or "(no error)" when it throws none.
template <typename Error = UsageError>
std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace testing
}  // namespace lockstep
