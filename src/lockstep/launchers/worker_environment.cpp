#include <lockstep/launchers/worker_environment.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include <lockstep/launchers/launch_error.h>

#include "process_utils.h"

namespace lockstep {
namespace launchers {

std::map<std::string, std::string> worker_variables(const LaunchOptions& options, int local_rank,
                                                    int resolved_port, int restart_count) {
  const int nproc = options.nproc_per_node();
  if (local_rank < 0 || local_rank >= nproc) {
    throw LaunchError("local_rank=" + std::to_string(local_rank) + " but nproc_per_node=" +
                      std::to_string(nproc) + ": local ranks run from 0 to " +
                      std::to_string(nproc - 1) + ".");
  }
  if (resolved_port < 1 || resolved_port > 65535) {
    throw LaunchError("master port " + std::to_string(resolved_port) +
                      " is not a TCP port (1..65535): resolve master_port 0 with "
                      "resolve_master_port() first.");
  }
  if (restart_count < 0 || restart_count > options.max_restarts()) {
    throw LaunchError("restart_count=" + std::to_string(restart_count) + " but max_restarts=" +
                      std::to_string(options.max_restarts()) + ": attempts run from 0 to " +
                      std::to_string(options.max_restarts()) + ".");
  }
  const std::string rank = std::to_string(options.node_rank() * nproc + local_rank);
  const std::string world_size = std::to_string(options.world_size());
  const std::string log_dir =
      options.log_dir().empty() ? detail::default_log_dir(options.run_id()) : options.log_dir();

  std::map<std::string, std::string> vars = {
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"RANK", rank},
      {"GROUP_RANK", std::to_string(options.node_rank())},
      {"ROLE_RANK", rank},
      {"ROLE_NAME", "default"},
      {"LOCAL_WORLD_SIZE", std::to_string(nproc)},
      {"WORLD_SIZE", world_size},
      {"GROUP_WORLD_SIZE", std::to_string(options.nnodes())},
      {"ROLE_WORLD_SIZE", world_size},
      {"MASTER_ADDR", options.master_addr()},
      {"MASTER_PORT", std::to_string(resolved_port)},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(restart_count)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(options.max_restarts())},
      {"TORCHELASTIC_RUN_ID", options.run_id()},
      {"TORCHELASTIC_USE_AGENT_STORE", "False"},
      {"TORCHELASTIC_ERROR_FILE",
       log_dir + "/attempt_" + std::to_string(restart_count) + "/" + std::to_string(local_rank) +
           "/error.json"},
  };
  const char* nccl = std::getenv(kNcclAsyncErrorHandling);
  vars[kNcclAsyncErrorHandling] = nccl != nullptr ? nccl : "1";
  // torchrun sets OMP_NUM_THREADS=1 so N workers do not each start a thread per core.
  if (const char* omp = std::getenv("OMP_NUM_THREADS")) {
    vars["OMP_NUM_THREADS"] = omp;
  } else if (nproc > 1) {
    vars["OMP_NUM_THREADS"] = "1";
  }
  vars.insert(options.worker_variables().begin(), options.worker_variables().end());  // ours win
  return vars;
}

int find_free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    throw LaunchError(std::string("cannot open a socket to find a free port: ") +
                      std::strerror(errno) + ". Give a port with --master-port P.");
  }
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  address.sin_port = 0;
  socklen_t length = sizeof(address);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    const int error = errno;
    ::close(fd);
    throw LaunchError(std::string("cannot bind a socket to find a free port: ") +
                      std::strerror(error) + ". Give a port with --master-port P.");
  }
  ::close(fd);
  return ntohs(address.sin_port);
}

int resolve_master_port(const LaunchOptions& options) {
  return options.master_port() != 0 ? options.master_port() : find_free_port();
}

}  // namespace launchers
}  // namespace lockstep
