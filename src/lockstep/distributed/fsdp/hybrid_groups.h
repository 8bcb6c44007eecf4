#pragma once
// The process groups of HYBRID_SHARD (not installed).

#include <memory>

#include <lockstep/distributed/process_group.h>

namespace lockstep {
namespace distributed {
namespace detail {

struct HybridGroups {
  std::shared_ptr<ProcessGroup> shard;    // this rank's group of `size` consecutive ranks
  std::shared_ptr<ProcessGroup> replica;  // the ranks that hold the same shards as this one
};

/// Splits `group` into groups of `size` consecutive ranks (0: the ranks of each host, which must
/// be consecutive and as many on every host), replicas of each other. Both null when one group
/// holds every rank (FULL_SHARD). Every rank creates every subgroup, in one order (a collective).
/// UsageError for a size that does not divide the ranks.
HybridGroups make_hybrid_groups(ProcessGroup& group, int size);

}  // namespace detail
}  // namespace distributed
}  // namespace lockstep
