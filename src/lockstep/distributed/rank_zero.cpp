#include <lockstep/distributed/rank_zero.h>

#include <unistd.h>

#include <atomic>
#include <cstdlib>

namespace lockstep {
namespace distributed {
namespace {

int rank_from_environment() {
  for (const char* name : {"RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "JSM_NAMESPACE_RANK"}) {
    const char* value = std::getenv(name);
    if (value == nullptr || *value == '\0') continue;
    char* end = nullptr;
    const long rank = std::strtol(value, &end, 10);
    if (*end == '\0' && rank >= 0) return static_cast<int>(rank);
  }
  return 0;
}

std::atomic<int> known_rank{-1};

}  // namespace

int global_rank() {
  const int rank = known_rank.load();
  return rank >= 0 ? rank : rank_from_environment();
}

void set_global_rank(int rank) { known_rank.store(rank); }

void rank_log(const std::string& message) {
  const std::string line = "[rank " + std::to_string(global_rank()) + "] " + message + "\n";
  ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
}

void rank_zero_log(const std::string& message) {
  if (global_rank() == 0) rank_log(message);
}

}  // namespace distributed
}  // namespace lockstep
