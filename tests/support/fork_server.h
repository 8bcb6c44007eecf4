#pragma once
// Test cases (and runs of the programs of tests/programs) forked from a process that has already
// loaded LibTorch. CTest runs every test case as its own process, and Debian's LibTorch costs each
// one about 0.6 s of CPU before main() (287 shared libraries to bind, then its operator registry;
// 2026-12-03). Through test_fork_client (fork_client.cpp, the test program's
// CROSSCOMPILING_EMULATOR), a case is a fork of one server per test program instead: still a
// process of its own, with the client's arguments, environment, working folder and standard
// streams, and CTest still sees one test per case.
//
// The request on the socket: stdin, stdout and stderr as SCM_RIGHTS beside a header of three
// uint32 (argc, envc, the bytes that follow), then argc + envc + 1 NUL-terminated strings (argv,
// environ, the working folder). The answer: the case's wait status, an int.

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace lockstep {
namespace testing {

/// The variable that makes a test program a fork server, listening on the abstract socket it
/// names; test_fork_client sets it when it starts one.
inline constexpr const char* kForkServerVariable = "LOCKSTEP_TEST_FORK_SERVER";

struct ForkRequestHeader {
  uint32_t argc = 0;
  uint32_t envc = 0;
  uint32_t bytes = 0;
};

/// The abstract Unix socket address `name` (no file to clean up); `length` receives its size.
inline sockaddr_un abstract_address(const char* name, socklen_t* length) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  const size_t n = std::min(std::strlen(name), sizeof(address.sun_path) - 1);
  std::memcpy(address.sun_path + 1, name, n);
  *length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
  return address;
}

/// Reads exactly `size` bytes; false at the end of the stream or on an error.
inline bool read_all(int fd, char* data, size_t size) {
  while (size > 0) {
    const ssize_t got = ::read(fd, data, size);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    data += got;
    size -= static_cast<size_t>(got);
  }
  return true;
}

/// A program's body: what main() would do with these arguments; its result is the exit code.
using ProgramBody = int (*)(int argc, char** argv);

/// Serves forks on the abstract socket `name` until nothing has been asked for 30 s; each fork
/// runs `body` with the client's arguments and exits with its result. Returns 0 when it ends, also
/// at once when another server already holds the name.
int serve_forks(const char* name, ProgramBody body);

/// main() of a program of tests/programs: `body` as it is, or a fork server when test_fork_client
/// started this process as one (`test_fork_client --program PROGRAM ARGS...`). A forked run must
/// not start ranks: the library takes the command line it relaunches from /proc/self/cmdline when
/// it loads, and a fork's is the server's.
inline int program_main(int argc, char** argv, ProgramBody body) {
  if (const char* name = std::getenv(kForkServerVariable)) return serve_forks(name, body);
  return body(argc, argv);
}

}  // namespace testing
}  // namespace lockstep
