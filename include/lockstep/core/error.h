#pragma once
/// lockstep::Error: every error Lockstep raises on purpose. Its kind says what went wrong and
/// which exit code a program ends with (cli::guarded_main prints one "PROGRAM: error: ..." line):
///   usage        bad input: an option, a flag, an argument, a file             exit code 2
///   environment  a scheduler's variables half-set or contradicting the options  exit code 2
///   launch       worker processes that cannot start                             exit code 2
///   distributed  a collective that failed or timed out, a peer that died        exit code 1
///   training     a run that cannot go on: a loss that is not finite             exit code 1
///   stopped      a signal stopped every rank after a resumable checkpoint       128 + signal
/// Every message says what was wrong, what was given and the fix. Each layer has its class
/// (UsageError here, environments::EnvironmentError, launchers::LaunchError,
/// distributed::DistributedError); catch `const lockstep::Error&` for all of them.

#include <sstream>
#include <stdexcept>
#include <string>

namespace lockstep {

enum class ErrorKind { usage, environment, launch, distributed, training, stopped };

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message)
      : std::runtime_error(message), kind_(kind),
        exit_code_(kind == ErrorKind::distributed || kind == ErrorKind::training ? 1 : 2) {}
  Error(ErrorKind kind, const std::string& message, int exit_code)
      : std::runtime_error(message), kind_(kind), exit_code_(exit_code) {}
  ErrorKind kind() const noexcept { return kind_; }
  /// The code a program ends with (the table above).
  int exit_code() const noexcept { return exit_code_; }

 private:
  ErrorKind kind_;
  int exit_code_;
};

/// Bad input from the user: an option, a flag, a device string, an argument that contradicts
/// another.
class UsageError : public Error {
 public:
  explicit UsageError(const std::string& message) : Error(ErrorKind::usage, message) {}
};

/// The message of `e` for a line of ours: LibTorch's c10::Error without the C++ backtrace that
/// its what() carries in LibTorch 2.x; what() of any other exception.
std::string message_of(const std::exception& e);

namespace detail {
template <typename... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}
}  // namespace detail

}  // namespace lockstep

/// Throws `ErrorType` (a lockstep::Error class) with the parts of the message joined, unless
/// `condition` holds, in the shape of TORCH_CHECK:
///   LOCKSTEP_CHECK(n >= 1, UsageError, "accumulate_grad_batches is ", n, ": use 1 or more.");
#define LOCKSTEP_CHECK(condition, ErrorType, ...)                       \
  do {                                                                  \
    if (!(condition)) throw ErrorType(::lockstep::detail::concat(__VA_ARGS__)); \
  } while (false)
