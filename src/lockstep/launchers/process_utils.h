#pragma once
// Internals of the launchers: the process's environment, executables, log folders, threads.

#include <map>
#include <string>
#include <vector>

#include <lockstep/launchers/launch_options.h>

namespace lockstep {
namespace launchers {
namespace detail {

/// Every variable of the calling process.
std::map<std::string, std::string> current_environment();

/// `base` with `overrides` written over it.
std::map<std::string, std::string> merged(std::map<std::string, std::string> base,
                                          const std::map<std::string, std::string>& overrides);

/// The file execve would run for `program`: itself when it contains a '/', else the first
/// executable regular file named so in `path_variable`'s folders (as execvp searches). Throws
/// LaunchError saying why `program` cannot run (missing, a folder, not executable).
std::string resolve_executable(const std::string& program, const std::string& path_variable);

/// This process's argv as it was when the program started (read from /proc/self/cmdline when
/// the library loaded, so later in-place edits of argv do not reach the workers).
std::vector<std::string> self_command_line();

/// Threads of this process (entries of /proc/self/task).
int count_threads();

/// Stops OpenBLAS's idle thread pool when OpenBLAS is loaded (LibTorch's BLAS on Debian starts it
/// at load time, one thread per extra core); it starts again at the next BLAS call. OpenBLAS
/// does the same itself before every fork (pthread_atfork), so its threads are no hazard to a
/// fork, and must not count as threads a fork would lose.
void stop_idle_blas_threads();

/// $TMPDIR, else /tmp.
std::string temp_root();

/// $TMPDIR/lockstep_<run_id with unusual characters replaced by '_'>.
std::string default_log_dir(const std::string& run_id);

/// `options` with an empty log_dir replaced by a new private folder (mkdtemp) under $TMPDIR.
LaunchOptions with_private_log_dir(LaunchOptions options);

/// Makes the folder of a worker's error file and removes a stale file from an earlier job.
void prepare_error_file(const std::string& path);

/// Removes the error folders of `nproc` local ranks in `attempts` attempts (attempt_0..) under
/// `log_dir` that stayed empty, and `log_dir` itself when it is empty and `remove_root`; folders
/// holding an error report stay.
void remove_empty_log_dirs(const std::string& log_dir, int nproc, int attempts, bool remove_root);

/// For a job on one machine: a new folder only this user can open (mode 0700) and the path of
/// the ranks' rendezvous file in it (`<folder>/store`; ProcessGroupOptions::store_file), which
/// replaces a TCPStore listening on the network. Throws LaunchError if it cannot be made.
std::string make_private_store_file(const std::string& run_id);
/// Removes that folder with what is in it ("" does nothing).
void remove_private_store(const std::string& store_file);

/// Writes "lockstep: <line>" to stderr and flushes it.
void say(const std::string& line);

/// Whether a regular file exists at `path`.
bool file_exists(const std::string& path);

}  // namespace detail
}  // namespace launchers
}  // namespace lockstep
