#include <lockstep/environments/local_environment.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace lockstep {
namespace environments {
namespace {

// Closes the socket on every path out of find_free_port.
class SocketGuard {
 public:
  explicit SocketGuard(int fd) : fd_(fd) {}
  ~SocketGuard() {
    if (fd_ >= 0) ::close(fd_);
  }
  SocketGuard(const SocketGuard&) = delete;
  SocketGuard& operator=(const SocketGuard&) = delete;
  int fd() const { return fd_; }

 private:
  int fd_;
};

EnvironmentError no_free_port(const std::string& step) {
  return EnvironmentError("Could not find a free TCP port on 127.0.0.1 (" + step +
                          " failed: " + std::strerror(errno) +
                          "). Set MASTER_PORT to a free port, e.g. MASTER_PORT=29500.");
}

}  // namespace

int find_free_port() {
  SocketGuard socket_fd(::socket(AF_INET, SOCK_STREAM, 0));
  if (socket_fd.fd() < 0) throw no_free_port("socket()");
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = 0;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(socket_fd.fd(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    throw no_free_port("bind()");
  }
  socklen_t length = sizeof(address);
  if (::getsockname(socket_fd.fd(), reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    throw no_free_port("getsockname()");
  }
  return ntohs(address.sin_port);
}

LocalEnvironment::LocalEnvironment(const Environ& env) {
  placement_.main_address = env.get("MASTER_ADDR").value_or("127.0.0.1");
  if (placement_.main_address.empty()) {
    throw EnvironmentError(
        "MASTER_ADDR is set but empty. Set it to the host of rank 0, or unset it to use "
        "127.0.0.1.");
  }
  auto port = env.get("MASTER_PORT");
  placement_.main_port = port ? detail::parse_port("MASTER_PORT", *port) : find_free_port();
  if (auto rank = env.get("RANK"); rank && !env.has("WORLD_SIZE")) {
    throw EnvironmentError("RANK=" + *rank +
                           " is set but WORLD_SIZE is not: a rank means nothing without the "
                           "number of processes; set WORLD_SIZE to it or unset RANK.");
  }
  placement_.world_size = env.get_int("WORLD_SIZE").value_or(1);
  detail::check_positive("WORLD_SIZE", placement_.world_size);
  placement_.global_rank = env.get_int("RANK").value_or(0);
  detail::check_rank_below("RANK", placement_.global_rank, "WORLD_SIZE", placement_.world_size);
  placement_.local_rank = env.get_int("LOCAL_RANK").value_or(0);
  detail::check_rank_below("LOCAL_RANK", placement_.local_rank, "WORLD_SIZE", placement_.world_size);
  auto node_rank = env.get_int("NODE_RANK");
  placement_.node_rank = node_rank ? *node_rank : env.get_int("GROUP_RANK").value_or(0);
  node_rank_given_ = node_rank.has_value();
  world_size_given_ = env.has("WORLD_SIZE");
  main_given_ = env.has("MASTER_ADDR") && port.has_value();
}

void LocalEnvironment::validate_settings(int devices, int num_nodes) const {
  if (!node_rank_given_) return;  // one node (the connector refuses --num-nodes above 1 then)
  // Lightning's manual recipe: this process starts the ranks of node NODE_RANK.
  const std::string nodes = std::to_string(num_nodes);
  const std::string node = "NODE_RANK=" + std::to_string(placement_.node_rank);
  if (placement_.node_rank >= num_nodes) {
    throw EnvironmentError(node + " but --num-nodes " + nodes + ": node ranks run from 0 to " +
                           std::to_string(num_nodes - 1) + ". Give --num-nodes the number of nodes, or unset "
                           "NODE_RANK for a job on one machine.");
  }
  if (num_nodes > 1 && !main_given_) {
    throw EnvironmentError(node + " with --num-nodes " + nodes + " needs MASTER_ADDR and MASTER_PORT on every node: "
                           "node 0's address and a free port there, the same on all nodes (e.g. MASTER_ADDR=node01 "
                           "MASTER_PORT=29500).");
  }
  if (world_size_given_ && placement_.world_size != devices * num_nodes) {
    throw EnvironmentError("WORLD_SIZE=" + std::to_string(placement_.world_size) + " but --devices " +
                           std::to_string(devices) + " --num-nodes " + nodes + " start " +
                           std::to_string(devices * num_nodes) + " processes in all. Use --devices " +
                           std::to_string(placement_.world_size / num_nodes) + " (WORLD_SIZE / --num-nodes), set "
                           "WORLD_SIZE=" + std::to_string(devices * num_nodes) + ", or unset it.");
  }
}

}  // namespace environments
}  // namespace lockstep
