#include "process_utils.h"

#include <dirent.h>
#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include <lockstep/launchers/launch_error.h>

extern char** environ;

namespace lockstep {
namespace launchers {
namespace detail {

std::map<std::string, std::string> current_environment() {
  std::map<std::string, std::string> vars;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const std::string text(*entry);
    const auto equals = text.find('=');
    if (equals == std::string::npos) continue;
    vars.emplace(text.substr(0, equals), text.substr(equals + 1));
  }
  return vars;
}

std::map<std::string, std::string> merged(std::map<std::string, std::string> base,
                                          const std::map<std::string, std::string>& overrides) {
  for (const auto& [name, value] : overrides) base[name] = value;
  return base;
}

namespace {

// Why `path` cannot be executed, or "" when it can.
std::string why_not_executable(const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) return std::strerror(errno);
  if (S_ISDIR(info.st_mode)) return "it is a folder, not a program";
  if (!S_ISREG(info.st_mode)) return "it is not a regular file";
  if (::access(path.c_str(), X_OK) != 0) {
    std::ostringstream mode;
    mode << "it is not executable (mode " << std::oct << (info.st_mode & 07777) << ")";
    return mode.str();
  }
  return "";
}

}  // namespace

std::string resolve_executable(const std::string& program, const std::string& path_variable) {
  if (program.empty()) {
    throw LaunchError("the program to launch is empty. Give it after --, e.g. "
                      "lockstep launch --nproc-per-node 2 -- ./train --max-epochs 1");
  }
  if (program.find('/') != std::string::npos) {
    const std::string why = why_not_executable(program);
    if (why.empty()) return program;
    throw LaunchError("cannot launch '" + program + "': " + why +
                      ". Give the path of an executable file (chmod +x it if needed), or run a "
                      "script through its interpreter, e.g. -- python3 " + program + ".");
  }
  // Like execvp: an empty PATH entry is the current folder.
  std::string first_failure;
  std::istringstream folders(path_variable);
  for (std::string folder; std::getline(folders, folder, ':');) {
    const std::string candidate = (folder.empty() ? std::string(".") : folder) + "/" + program;
    const std::string why = why_not_executable(candidate);
    if (why.empty()) return candidate;
    if (first_failure.empty() && ::access(candidate.c_str(), F_OK) == 0) {
      first_failure = candidate + ": " + why;
    }
  }
  throw LaunchError("cannot launch '" + program + "': " +
                    (first_failure.empty() ? "no such program in PATH=" + path_variable
                                           : first_failure) +
                    ". Give the path of an executable file (e.g. ./" + program +
                    ") or add its folder to PATH.");
}

namespace {

std::vector<std::string> read_command_line() {
  std::ifstream file("/proc/self/cmdline", std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  std::vector<std::string> argv;
  std::string::size_type start = 0;
  while (start < text.size()) {
    const auto end = text.find('\0', start);
    argv.push_back(text.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return argv;
}

// Read when the library loads, before main() runs: /proc/self/cmdline shows the argv memory as it
// is now, so a program that permutes its argv (getopt) or scrubs a secret in place would
// otherwise re-execute its workers with the edited words.
const std::vector<std::string> command_line_at_start = read_command_line();

}  // namespace

std::vector<std::string> self_command_line() {
  const auto& argv = command_line_at_start;
  if (argv.empty()) {
    throw LaunchError("cannot read this program's command line from /proc/self/cmdline, which "
                      "re-executing it needs. Mount /proc, or use --strategy ddp_fork.");
  }
  return argv;
}

int count_threads() {
  DIR* tasks = ::opendir("/proc/self/task");
  if (tasks == nullptr) {
    throw LaunchError(std::string("cannot count this process's threads in /proc/self/task: ") +
                      std::strerror(errno) + ". Mount /proc, or use --strategy ddp.");
  }
  int count = 0;
  while (const dirent* entry = ::readdir(tasks)) {
    if (entry->d_name[0] != '.') ++count;
  }
  ::closedir(tasks);
  return count;
}

void stop_idle_blas_threads() {
  using Shutdown = int (*)();
  // Looked up, not linked: the launchers must not depend on which BLAS (if any) is loaded.
  if (auto shutdown = reinterpret_cast<Shutdown>(::dlsym(RTLD_DEFAULT, "blas_thread_shutdown_"))) {
    shutdown();
  }
}

std::string temp_root() {
  const char* tmpdir = std::getenv("TMPDIR");
  return tmpdir != nullptr && tmpdir[0] != '\0' ? tmpdir : "/tmp";
}

namespace {

std::string path_safe(const std::string& name) {
  std::string safe = name;
  for (char& c : safe) {
    const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                       c == '-' || c == '_' || c == '.';
    if (!plain) c = '_';
  }
  return safe;
}

}  // namespace

std::string default_log_dir(const std::string& run_id) {
  return temp_root() + "/lockstep_" + path_safe(run_id);
}

LaunchOptions with_private_log_dir(LaunchOptions options) {
  if (!options.log_dir().empty()) return options;
  std::string pattern = default_log_dir(options.run_id()) + "_XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) {
    throw LaunchError("cannot make a folder for the workers' error files under " + temp_root() +
                      ": " + std::strerror(errno) + ". Set TMPDIR to a writable folder.");
  }
  return options.log_dir(pattern);
}

void prepare_error_file(const std::string& path) {
  const std::filesystem::path file(path);
  std::error_code error;
  std::filesystem::create_directories(file.parent_path(), error);
  if (error) {
    throw LaunchError("cannot make the folder of the worker error file " + path + ": " +
                      error.message() + ". Pass a writable log_dir (--log-dir).");
  }
  std::filesystem::remove(file, error);
}

void remove_empty_log_dirs(const std::string& log_dir, int nproc, int attempts, bool remove_root) {
  std::error_code ignored;  // a folder that holds a report is not empty and stays
  const std::filesystem::path root(log_dir);
  for (int attempt = 0; attempt < attempts; ++attempt) {
    const auto folder = root / ("attempt_" + std::to_string(attempt));
    for (int rank = 0; rank < nproc; ++rank) {
      std::filesystem::remove(folder / std::to_string(rank), ignored);
    }
    std::filesystem::remove(folder, ignored);
  }
  if (remove_root) std::filesystem::remove(root, ignored);
}

std::string make_private_store_file(const std::string& run_id) {
  std::string pattern = temp_root() + "/lockstep_store_" + path_safe(run_id) + "_XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) {
    throw LaunchError("cannot make a private folder for the workers' rendezvous file under " + temp_root() + ": " +
                      std::strerror(errno) + ". Set TMPDIR to a writable folder.");
  }
  return pattern + "/store";
}

void remove_private_store(const std::string& store_file) {
  if (store_file.empty()) return;
  std::error_code ignored;
  std::filesystem::remove_all(std::filesystem::path(store_file).parent_path(), ignored);
}

void say(const std::string& line) {
  const std::string text = "lockstep: " + line + "\n";
  std::fputs(text.c_str(), stderr);
  std::fflush(stderr);
}

bool file_exists(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode);
}

}  // namespace detail
}  // namespace launchers
}  // namespace lockstep
