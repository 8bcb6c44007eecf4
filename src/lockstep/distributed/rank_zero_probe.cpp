#include "rank_zero_probe.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <future>
#include <memory>
#include <thread>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <lockstep/core/error.h>
#include <lockstep/distributed/distributed_error.h>

#include "wait_for.h"

namespace lockstep {
namespace distributed {
namespace detail {
namespace {

// Whether something at `address`:`port` accepts a TCP connection within `wait` (a refusal or an
// unresolved name is a no at once).
bool accepts_connections(const std::string& address, int port, std::chrono::milliseconds wait) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(address.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return false;
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> owned(found, ::freeaddrinfo);
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    bool connected = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0;
    if (!connected && errno == EINPROGRESS) {
      pollfd pending{fd, POLLOUT, 0};
      int error = 0;
      socklen_t size = sizeof(error);
      connected = ::poll(&pending, 1, static_cast<int>(wait.count())) == 1 &&
                  ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size) == 0 && error == 0;
    }
    ::close(fd);
    if (connected) return true;
  }
  return false;
}

}  // namespace

void await_rank_zero(const std::string& address, int port, std::chrono::milliseconds timeout,
                     const std::string& who) {
  using namespace std::chrono;
  const std::string endpoint = address + ":" + std::to_string(port);
  const auto started = steady_clock::now();
  const auto deadline = started + timeout;
  while (!accepts_connections(address, port, milliseconds(1000))) {
    if (steady_clock::now() >= deadline) {
      throw DistributedError(who + ": rendezvous at " + endpoint + " timed out after " + seconds(timeout) +
                             " (nothing accepted connections there). Check that every rank was started with the "
                             "same MASTER_ADDR/MASTER_PORT, that rank 0 is running and that the port is free.");
    }
    std::this_thread::sleep_for(milliseconds(100));
  }
  // A throwaway connection on a thread of its own, left behind if nothing answers: LibTorch 2.x's
  // TCPStore constructor waits for the server's reply without a timeout.
  const auto answer_within = std::min<milliseconds>(kRankZeroAnswers, timeout);
  auto answer = std::make_shared<std::promise<std::string>>();  // "" when rank 0 answered
  auto answered = answer->get_future();
  std::thread([answer, address, port, answer_within] {
    try {
      c10d::TCPStoreOptions options;
      options.port = static_cast<std::uint16_t>(port);
      options.isServer = false;
      options.waitWorkers = false;
      options.timeout = answer_within;
      c10d::TCPStore probe(address, options);
      probe.wait({"lockstep/join/world_size"}, answer_within);
      answer->set_value("");
    } catch (const std::exception& e) {
      answer->set_value(message_of(e));
    }
  }).detach();
  std::string why = "no answer";
  if (answered.wait_for(answer_within + milliseconds(500)) == std::future_status::ready) {
    why = answered.get();
    if (why.empty()) return;
  }
  throw DistributedError(who + ": rendezvous at " + endpoint + " failed after " +
                         seconds(duration_cast<milliseconds>(steady_clock::now() - started)) +
                         ": something accepts connections there, but it did not answer as rank 0 of a Lockstep job "
                         "within " + seconds(answer_within) + " (" + why + "). Port " + std::to_string(port) +
                         " is taken by another program or job (rank 0 then fails with 'already in use'): start "
                         "every rank with a free MASTER_PORT.");
}

}  // namespace detail
}  // namespace distributed
}  // namespace lockstep
