// test_fork_client PROGRAM ARGS...: runs one test case of PROGRAM as a fork of PROGRAM's fork
// server (fork_server.h), starting the server when none answers, and ends as the case ended (its
// exit code, or the signal that killed it). Without a --gtest_filter (CTest's discovery, a whole
// program) or where no server can be reached, it runs PROGRAM itself.
// test_fork_client --program PROGRAM ARGS...: the same for a program of tests/programs (whose
// main() is program_main), whatever its arguments.
// One server per program file and environment: a rebuilt program or another environment gets a
// server of its own, and a server left idle for 30 s ends.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "fork_server.h"

extern char** environ;

namespace {

using lockstep::testing::abstract_address;

[[noreturn]] void run_directly(char** argv) {
  ::execv(argv[0], argv);
  std::perror((std::string("test_fork_client: cannot run ") + argv[0]).c_str());
  std::_Exit(127);
}

// The server's name: a hash of the program file (path, inode, modification time) and the environment.
std::string server_name(const char* program) {
  struct stat file {};
  if (::stat(program, &file) != 0) return "";
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
  std::sort(env.begin(), env.end());
  std::string key = std::string(program) + '\0' + std::to_string(file.st_ino) + '\0' +
                    std::to_string(file.st_mtim.tv_sec) + '.' + std::to_string(file.st_mtim.tv_nsec);
  for (const auto& e : env) key += '\0' + e;
  uint64_t hash = 1469598103934665603ull;  // FNV-1a
  for (const unsigned char c : key) hash = (hash ^ c) * 1099511628211ull;
  char name[64];
  std::snprintf(name, sizeof name, "lockstep-test-%016llx", static_cast<unsigned long long>(hash));
  return name;
}

int connect_to(const std::string& name) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  socklen_t length = 0;
  const sockaddr_un address = abstract_address(name.c_str(), &length);
  if (fd >= 0 && ::connect(fd, reinterpret_cast<const sockaddr*>(&address), length) == 0) return fd;
  if (fd >= 0) ::close(fd);
  return -1;
}

// PROGRAM as a fork server, detached from this process (its own session, no streams).
void start_server(const char* program, const std::string& name) {
  const pid_t child = ::fork();
  if (child == 0) {
    ::setsid();
    if (::fork() != 0) std::_Exit(0);
    // Nothing of the caller's stays open in the server: a pipe that CTest (or CI) reads to its end
    // must not wait for an idle server.
    const int null = ::open("/dev/null", O_RDWR);
    for (int i = 0; i < 3; ++i) ::dup2(null, i);
    ::close_range(3, ~0u, 0);
    ::setenv(lockstep::testing::kForkServerVariable, name.c_str(), 1);
    ::execl(program, program, static_cast<char*>(nullptr));
    std::_Exit(127);
  }
  if (child > 0) ::waitpid(child, nullptr, 0);
}

bool send_request(int connection, int argc, char** argv) {
  std::string strings;
  for (int i = 0; i < argc; ++i) strings.append(argv[i]).push_back('\0');
  uint32_t envc = 0;
  for (char** e = environ; *e != nullptr; ++e, ++envc) strings.append(*e).push_back('\0');
  char folder[4096];
  if (::getcwd(folder, sizeof folder) == nullptr) return false;
  strings.append(folder).push_back('\0');
  lockstep::testing::ForkRequestHeader header{static_cast<uint32_t>(argc), envc, static_cast<uint32_t>(strings.size())};
  int streams[3] = {0, 1, 2};
  iovec io{&header, sizeof header};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof streams)] = {};
  msghdr message{};
  message.msg_iov = &io;
  message.msg_iovlen = 1;
  message.msg_control = control;
  message.msg_controllen = sizeof control;
  cmsghdr* rights = CMSG_FIRSTHDR(&message);
  rights->cmsg_level = SOL_SOCKET;
  rights->cmsg_type = SCM_RIGHTS;
  rights->cmsg_len = CMSG_LEN(sizeof streams);
  std::memcpy(CMSG_DATA(rights), streams, sizeof streams);
  if (::sendmsg(connection, &message, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof header)) return false;
  for (size_t at = 0; at < strings.size();) {
    const ssize_t sent = ::send(connection, strings.data() + at, strings.size() - at, MSG_NOSIGNAL);
    if (sent <= 0) return false;
    at += static_cast<size_t>(sent);
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: test_fork_client [--program] PROGRAM [ARGS...]\n");
    return 2;
  }
  const bool program = std::strcmp(argv[1], "--program") == 0 && argc > 2;
  char** program_argv = argv + (program ? 2 : 1);
  const bool one_case = program || std::any_of(program_argv, argv + argc, [](const char* a) {
    return std::strncmp(a, "--gtest_filter=", 15) == 0;
  });
  const std::string name = one_case ? server_name(program_argv[0]) : "";
  if (name.empty()) run_directly(program_argv);
  int connection = connect_to(name);
  if (connection < 0) {
    start_server(program_argv[0], name);
    // LibTorch loads in about a second; a loaded machine may take several.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (connection < 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      connection = connect_to(name);
    }
  }
  const int program_argc = static_cast<int>(argv + argc - program_argv);
  if (connection < 0 || !send_request(connection, program_argc, program_argv)) run_directly(program_argv);
  int status = 0;
  if (!lockstep::testing::read_all(connection, reinterpret_cast<char*>(&status), sizeof status)) {
    std::fprintf(stderr, "test_fork_client: the fork server of %s ended before the test case did\n", program_argv[0]);
    return 1;
  }
  if (WIFSIGNALED(status)) {
    ::signal(WTERMSIG(status), SIG_DFL);
    ::raise(WTERMSIG(status));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
