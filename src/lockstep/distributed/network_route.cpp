#include <lockstep/distributed/network_route.h>

#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include <lockstep/distributed/process_group.h>

namespace lockstep {
namespace distributed {
namespace {

std::string numeric_address(const sockaddr* address) {
  char host[NI_MAXHOST] = {0};
  const socklen_t size = address->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  if (::getnameinfo(address, size, host, sizeof(host), nullptr, 0, NI_NUMERICHOST) != 0) return "";
  return host;
}

// This host's interfaces with an IP address: (name, address), IPv4 first.
std::vector<std::pair<std::string, std::string>> interface_addresses() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return {};
  std::unique_ptr<ifaddrs, void (*)(ifaddrs*)> owned(list, ::freeifaddrs);
  std::vector<std::pair<std::string, std::string>> out;
  for (int family : {AF_INET, AF_INET6}) {
    for (auto* i = list; i != nullptr; i = i->ifa_next) {
      if (i->ifa_addr != nullptr && i->ifa_addr->sa_family == family) {
        out.emplace_back(i->ifa_name, numeric_address(i->ifa_addr));
      }
    }
  }
  return out;
}

std::string interface_names() {
  std::string names;
  for (const auto& [name, address] : interface_addresses()) {
    if (names.find(name + " (") == std::string::npos) names += (names.empty() ? "" : ", ") + name + " (" + address + ")";
  }
  return names;
}

// The local address the kernel would send packets for `address` from: a UDP socket's connect
// picks the route and sends nothing.
std::string source_address_for(const std::string& address) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(address.c_str(), "9", &hints, &found); rc != 0) {
    throw DistributedError("the main address '" + address + "' does not resolve (" + ::gai_strerror(rc) +
                           "): set MASTER_ADDR (lockstep launch --master-addr) to the address or name of the "
                           "host of rank 0.");
  }
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> owned(found, ::freeaddrinfo);
  std::string why = "no address";
  for (auto* a = found; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t size = sizeof(local);
    const bool routed = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
                        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &size) == 0;
    why = std::strerror(errno);
    ::close(fd);
    if (routed) return numeric_address(reinterpret_cast<const sockaddr*>(&local));
  }
  throw DistributedError("no route from this host to the main address " + address + " (" + why +
                         "): check the network between the nodes, or set GLOO_SOCKET_IFNAME to the interface "
                         "that connects them (this host has " + interface_names() + ").");
}

}  // namespace

bool is_loopback_address(const std::string& address) { return address.rfind("127.", 0) == 0 || address == "::1"; }

std::string GlooInterface::describe() const { return name + " (" + address + "; " + why + ")"; }

GlooInterface gloo_interface(const std::string& main_address) {
  const auto interfaces = interface_addresses();
  if (const char* chosen = std::getenv("GLOO_SOCKET_IFNAME"); chosen != nullptr && *chosen != '\0') {
    for (const auto& [name, address] : interfaces) {
      if (name == chosen) return {name, address, "GLOO_SOCKET_IFNAME"};
    }
    throw DistributedError("GLOO_SOCKET_IFNAME=" + std::string(chosen) + " names no interface of this host with "
                           "an address; it has " + interface_names() + ". Set it to one of them, or unset it "
                           "to use the one that routes to the main address.");
  }
  const std::string source = source_address_for(main_address);
  std::string name = "?";
  for (const auto& [interface, address] : interfaces) {
    if (address == source) name = interface;
  }
  return {name, source, is_loopback_address(source) ? "the main address " + main_address + " is this host's loopback"
                                 : "routes to " + main_address};
}

std::vector<bool> hosts_answering(const std::vector<std::string>& addresses, int port,
                                  std::chrono::milliseconds wait) {
  std::vector<bool> answers(addresses.size(), false);
  std::vector<pollfd> pending;
  std::vector<size_t> pending_index;
  for (size_t i = 0; i < addresses.size(); ++i) {
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICHOST;
    addrinfo* found = nullptr;
    if (::getaddrinfo(addresses[i].c_str(), std::to_string(port).c_str(), &hints, &found) != 0) continue;
    std::unique_ptr<addrinfo, void (*)(addrinfo*)> owned(found, ::freeaddrinfo);
    const int fd = ::socket(found->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    if (::connect(fd, found->ai_addr, found->ai_addrlen) == 0 || errno == ECONNREFUSED) {
      answers[i] = true;
      ::close(fd);
    } else if (errno == EINPROGRESS) {
      pending.push_back({fd, POLLOUT, 0});
      pending_index.push_back(i);
    } else {
      ::close(fd);
    }
  }
  const auto deadline = std::chrono::steady_clock::now() + wait;
  size_t open = pending.size();
  while (open > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0 || ::poll(pending.data(), pending.size(), static_cast<int>(left.count())) <= 0) break;
    for (size_t k = 0; k < pending.size(); ++k) {
      if (pending[k].fd < 0 || pending[k].revents == 0) continue;
      int error = 0;
      socklen_t size = sizeof(error);
      ::getsockopt(pending[k].fd, SOL_SOCKET, SO_ERROR, &error, &size);
      answers[pending_index[k]] = error == 0 || error == ECONNREFUSED;
      ::close(pending[k].fd);
      pending[k].fd = -1;  // poll skips negative descriptors
      --open;
    }
  }
  for (const auto& p : pending) {
    if (p.fd >= 0) ::close(p.fd);
  }
  return answers;
}

}  // namespace distributed
}  // namespace lockstep
