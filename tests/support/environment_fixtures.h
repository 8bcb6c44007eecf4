#pragma once
// Helpers shared by the environment tests: recorded fixtures (tests/fixtures/environments),
// variations of them, and the EnvironmentError a call throws.

#include <map>
#include <optional>
#include <string>

#include <gtest/gtest.h>

#include <lockstep/environments/cluster_environment.h>

#include "paths.h"

namespace lockstep {
namespace testing {

using environments::Environ;
using environments::EnvironmentError;

inline Environ fixture(const std::string& name) {
  return Environ::from_env_file(std::string(LOCKSTEP_SOURCE_DIR) +
                                "/tests/fixtures/environments/" + name);
}

// `env` with some variables set (a value) or removed (nullopt).
inline Environ with(const Environ& env, const std::map<std::string, std::optional<std::string>>& changes) {
  auto vars = env.vars();
  for (const auto& [name, value] : changes) {
    if (value) {
      vars[name] = *value;
    } else {
      vars.erase(name);
    }
  }
  return Environ(vars);
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const EnvironmentError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an EnvironmentError";
  return "";
}

inline ::testing::AssertionResult contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << part << "' not in: " << text;
}

}  // namespace testing
}  // namespace lockstep
