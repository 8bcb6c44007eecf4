#pragma once
/// UsageError: bad input from the user (a flag, a device string, a setting that contradicts
/// another). Its message says what was wrong, what was given and how to fix it; binaries print
/// it and exit with code 2.

#include <stdexcept>

namespace lockstep {

class UsageError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

}  // namespace lockstep
