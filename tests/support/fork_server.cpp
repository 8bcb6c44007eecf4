#include "fork_server.h"

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <string>
#include <vector>

extern char** environ;

namespace lockstep {
namespace testing {
namespace {

constexpr int kIdleMs = 30000;

struct Request {
  int streams[3] = {-1, -1, -1};
  std::vector<std::string> argv, env;
  std::string folder;
};

struct Case {
  int connection;
  pid_t pid;
  int pidfd;
};

bool receive(int connection, Request& request) {
  ForkRequestHeader header;
  iovec io{&header, sizeof header};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof request.streams)];
  msghdr message{};
  message.msg_iov = &io;
  message.msg_iovlen = 1;
  message.msg_control = control;
  message.msg_controllen = sizeof control;
  const ssize_t got = ::recvmsg(connection, &message, MSG_CMSG_CLOEXEC);
  const cmsghdr* rights = got > 0 ? CMSG_FIRSTHDR(&message) : nullptr;
  if (rights == nullptr || rights->cmsg_type != SCM_RIGHTS || rights->cmsg_len != CMSG_LEN(sizeof request.streams)) {
    return false;
  }
  std::memcpy(request.streams, CMSG_DATA(rights), sizeof request.streams);
  if (!read_all(connection, reinterpret_cast<char*>(&header) + got, sizeof header - static_cast<size_t>(got))) {
    return false;
  }
  std::string strings(header.bytes, '\0');
  if (!read_all(connection, strings.data(), strings.size())) return false;
  size_t at = 0;
  const auto next = [&] {
    const size_t end = strings.find('\0', at);
    std::string s = strings.substr(at, end - at);
    at = end == std::string::npos ? strings.size() : end + 1;
    return s;
  };
  for (uint32_t i = 0; i < header.argc; ++i) request.argv.push_back(next());
  for (uint32_t i = 0; i < header.envc; ++i) request.env.push_back(next());
  request.folder = next();
  return !request.argv.empty();
}

// The forked case: the client's streams, folder, environment and arguments, in a process group of
// its own (the server ends the group when the client goes away: CTest's timeout).
[[noreturn]] void run_case(Request& request, ProgramBody body) {
  ::setpgid(0, 0);
  for (int i = 0; i < 3; ++i) ::dup2(request.streams[i], i);
  if (::chdir(request.folder.c_str()) != 0) {
    std::perror(("test fork server: chdir " + request.folder).c_str());
    std::_Exit(127);
  }
  // Never freed: environ and the body (gtest) point into them until the last destructor at exit
  // (LibTorch's read the environment).
  auto& kept = *new Request(std::move(request));
  auto& env = *new std::vector<char*>;
  for (auto& e : kept.env) env.push_back(e.data());
  env.push_back(nullptr);
  environ = env.data();
  auto& argv = *new std::vector<char*>;
  for (auto& a : kept.argv) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::exit(body(static_cast<int>(kept.argv.size()), argv.data()));
}

void end_case(const Case& c) {
  ::close(c.connection);
  ::close(c.pidfd);
}

}  // namespace

int serve_forks(const char* name, ProgramBody body) {
  const int listener = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  socklen_t length = 0;
  const sockaddr_un address = abstract_address(name, &length);
  if (listener < 0 || ::bind(listener, reinterpret_cast<const sockaddr*>(&address), length) != 0 ||
      ::listen(listener, 64) != 0) {
    return 0;  // another server holds the name; the client connects to that one
  }
  std::vector<Case> cases;
  for (;;) {
    std::vector<pollfd> polled{{listener, POLLIN, 0}};
    for (const auto& c : cases) {
      polled.push_back({c.connection, POLLRDHUP, 0});
      polled.push_back({c.pidfd, POLLIN, 0});
    }
    const int ready = ::poll(polled.data(), polled.size(), cases.empty() ? kIdleMs : -1);
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) return 0;
    std::vector<Case> running;
    for (size_t i = 0; i < cases.size(); ++i) {
      const Case& c = cases[i];
      if (polled[2 + 2 * i].revents != 0) {  // the case ended: its status to the client
        int status = 0;
        ::waitpid(c.pid, &status, 0);
        ::send(c.connection, &status, sizeof status, MSG_NOSIGNAL);
        end_case(c);
      } else if (polled[1 + 2 * i].revents != 0) {  // the client went away (killed on a timeout)
        ::kill(-c.pid, SIGKILL);
        ::kill(c.pid, SIGKILL);
        ::waitpid(c.pid, nullptr, 0);
        end_case(c);
      } else {
        running.push_back(c);
      }
    }
    cases = std::move(running);
    if ((polled[0].revents & POLLIN) == 0) continue;
    const int connection = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (connection < 0) continue;
    Request request;
    if (!receive(connection, request)) {
      for (int fd : request.streams) if (fd >= 0) ::close(fd);
      ::close(connection);
      continue;
    }
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(listener);
      for (const auto& c : cases) end_case(c);
      ::close(connection);
      run_case(request, body);
    }
    for (int fd : request.streams) ::close(fd);
    const int pidfd = pid > 0 ? static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)) : -1;
    if (pidfd < 0) {  // no case ran: the client reads no status and says so
      if (pid > 0) ::waitpid(pid, nullptr, 0);
      ::close(connection);
      continue;
    }
    cases.push_back({connection, pid, pidfd});
  }
}

}  // namespace testing
}  // namespace lockstep
