#include "hybrid_groups.h"

#include <numeric>
#include <string>
#include <vector>

#include <lockstep/core/error.h>

#include "../comm/hosts.h"

namespace lockstep {
namespace distributed {
namespace detail {
namespace {

// The ranks of each host, which must be consecutive and as many on every host.
int ranks_per_host(ProcessGroup& group) {
  const auto hosts = ranks_by_host(gather_strings(group, host_key(), "FSDP hosts"));
  const int size = static_cast<int>(hosts.front().size());
  for (const auto& ranks : hosts) {
    bool consecutive = static_cast<int>(ranks.size()) == size;
    for (size_t k = 0; consecutive && k < ranks.size(); ++k) consecutive = ranks[k] == ranks.front() + static_cast<int>(k);
    if (!consecutive) {
      throw UsageError("HYBRID_SHARD: the ranks of each host are not consecutive, or not as many on every host (" +
                       std::to_string(hosts.size()) + " hosts for " + std::to_string(group.world_size()) +
                       " ranks); set ShardingOptions::hybrid_shard_size to the ranks that shard one copy.");
    }
  }
  return size;
}

}  // namespace

HybridGroups make_hybrid_groups(ProcessGroup& group, int size) {
  const int world = group.world_size();
  if (size < 0 || size > world || (size > 0 && world % size != 0)) {
    throw UsageError("ShardingOptions: hybrid_shard_size " + std::to_string(size) + " does not divide the " +
                     std::to_string(world) + " ranks into groups; give a divisor of " + std::to_string(world) +
                     ", or 0 for the ranks of each host.");
  }
  if (size == 0) size = ranks_per_host(group);
  HybridGroups groups;
  if (size == world) return groups;  // one group: FULL_SHARD
  for (int first = 0; first < world; first += size) {
    std::vector<int> ranks(static_cast<size_t>(size));
    std::iota(ranks.begin(), ranks.end(), first);
    if (auto mine = group.new_subgroup(ranks)) groups.shard = std::move(mine);
  }
  for (int offset = 0; offset < size; ++offset) {
    std::vector<int> ranks;
    for (int r = offset; r < world; r += size) ranks.push_back(r);
    if (auto mine = group.new_subgroup(ranks)) groups.replica = std::move(mine);
  }
  return groups;
}

}  // namespace detail
}  // namespace distributed
}  // namespace lockstep
