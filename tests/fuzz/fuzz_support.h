#pragma once
// What every fuzz target shares: bad input must end in a lockstep::Error (one clear message, exit
// code 2 in a program); any other exception, a crash, a leak or a hang is a finding.

#include <cstddef>
#include <cstdint>
#include <string>

#include <lockstep/core/error.h>

namespace lockstep {
namespace fuzz {

inline std::string text(const uint8_t* data, size_t size) { return std::string(reinterpret_cast<const char*>(data), size); }

/// Runs `body`; a lockstep::Error is the expected answer to bad input, anything else escapes to
/// libFuzzer, which reports it.
template <typename Body>
void expect_only_lockstep_errors(Body&& body) {
  try {
    body();
  } catch (const Error&) {
  }
}

}  // namespace fuzz
}  // namespace lockstep
