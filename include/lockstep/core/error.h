#pragma once
/// lockstep::Error: every error Lockstep raises on purpose. Its kind says what went wrong and
/// which exit code a program ends with (cli::guarded_main prints one "PROGRAM: error: ..." line):
///   usage        bad input: an option, a flag, an argument, a file             exit code 2
///   environment  a scheduler's variables half-set or contradicting the options  exit code 2
///   launch       worker processes that cannot start                             exit code 2
///   distributed  a collective that failed or timed out, a peer that died        exit code 1
///   training     a run that cannot go on: a loss that is not finite             exit code 1
///   io           a file that cannot be written, renamed or removed (disk full)  exit code 1
///   stopped      a signal stopped every rank after a resumable checkpoint       128 + signal
/// Every message says what was wrong, what was given and the fix. Each layer has its class
/// (UsageError and IoError here, environments::EnvironmentError, launchers::LaunchError,
/// distributed::DistributedError); catch `const lockstep::Error&` for all of them.

#include <cerrno>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>

namespace lockstep {

enum class ErrorKind { usage, environment, launch, distributed, training, stopped, io };

/// The exit code of a kind (the table above): 2 for what the user can fix in the command or the
/// environment, 1 for a run that failed on the way.
constexpr int default_exit_code(ErrorKind kind) {
  return kind == ErrorKind::usage || kind == ErrorKind::environment || kind == ErrorKind::launch ? 2 : 1;
}

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message)
      : std::runtime_error(message), kind_(kind), exit_code_(default_exit_code(kind)) {}
  Error(ErrorKind kind, const std::string& message, int exit_code)
      : std::runtime_error(message), kind_(kind), exit_code_(exit_code) {}
  ErrorKind kind() const noexcept { return kind_; }
  /// The code a program ends with (the table above).
  int exit_code() const noexcept { return exit_code_; }
  /// Whether this process prints the message: false on every rank but global rank 0 for an
  /// error that all ranks raise alike (a stop they agreed on), so that cli::guarded_main prints
  /// it once for the job.
  bool report_here() const noexcept { return report_here_; }

 protected:
  void set_report_here(bool report) noexcept { report_here_ = report; }

 private:
  ErrorKind kind_;
  int exit_code_;
  bool report_here_ = true;
};

/// Bad input from the user: an option, a flag, a device string, an argument that contradicts
/// another.
class UsageError : public Error {
 public:
  explicit UsageError(const std::string& message) : Error(ErrorKind::usage, message) {}
};

/// A file or folder the operating system would not write, rename or remove (a full disk, a folder
/// without write permission, a parent that is a file). The message names what failed, the path,
/// the OS's reason and what to check:
///   throw IoError("appending a row to the metrics file", path, errno);
///   // "appending a row to the metrics file 'runs/version_0/metrics.csv' failed: No space left
///   //  on device. Check that its folder exists and is writable, and that the disk has free space."
class IoError : public Error {
 public:
  /// The fix when none is given.
  static constexpr const char* kCheckFolder =
      "Check that its folder exists and is writable, and that the disk has free space.";

  IoError(const std::string& action, const std::string& path, std::error_code error,
          const std::string& fix = kCheckFolder)
      : Error(ErrorKind::io, action + " '" + path + "' failed: " + error.message() + ". " + fix),
        path_(path), code_(error) {}
  /// `error` is an errno value; 0 (a stream that failed without setting errno) reads as EIO.
  IoError(const std::string& action, const std::string& path, int error, const std::string& fix = kCheckFolder)
      : IoError(action, path, std::error_code(error != 0 ? error : EIO, std::generic_category()), fix) {}
  /// The file or folder that failed.
  const std::string& path() const noexcept { return path_; }
  /// The operating system's reason (std::errc::no_space_on_device, permission_denied, ...).
  std::error_code code() const noexcept { return code_; }

 private:
  std::string path_;
  std::error_code code_;
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
