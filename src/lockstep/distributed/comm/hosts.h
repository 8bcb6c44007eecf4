#pragma once
// Which ranks share a host, for the shared-memory transport: a key per host, the ranks grouped
// by it, and the agreement on who can take part (not installed).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <lockstep/distributed/process_group.h>

#include "shared_memory_segment.h"

namespace lockstep {
namespace distributed {
namespace detail {

/// This host's key: hostname, boot id and pid namespace (ranks can share a memfd through
/// /proc/<pid>/fd/<fd> only on one kernel and in one pid namespace).
std::string host_key();
/// The hosts in order of their first rank, each with its ranks in rank order.
std::vector<std::vector<int>> ranks_by_host(const std::vector<std::string>& keys);
/// Every rank's `text`, in rank order (a collective tagged `tag`).
std::vector<std::string> gather_strings(ProcessGroup& group, const std::string& text, const std::string& tag);
/// "turned off in DDPOptions (ranks 0, 1)" (each reason once, with the ranks that gave it), or
/// "" if none refused.
std::string describe_refusals(const std::vector<std::string>& reasons);

/// One rank's share of its host's shared memory: the segment (null when refused), the hosts with
/// their ranks (ranks_by_host), the ranks of this rank's host and this rank's slot among them.
struct HostSegment {
  std::unique_ptr<SharedMemorySegment> memory;
  std::vector<std::vector<int>> hosts;
  std::vector<int> members;
  int local_rank = 0;
};

/// A collective over `group`: the ranks of each host map one segment with a slot of `slot_bytes`
/// per rank (its first rank creates it, the others open it), this rank's pid in its header; or
/// no rank gets one and `why_not` (may be null) says why, with the ranks that gave each reason:
/// a rank that `refused`, a host with one rank, hosts with different numbers of ranks, too many
/// ranks on a host, several hosts where `one_host` is asked, memory that could not be shared.
/// `host` names this rank's host ("": host_key()); `purpose` names the exchanges ("DDP shared
/// memory").
HostSegment join_host_segment(ProcessGroup& group, int64_t slot_bytes, const std::string& refused,
                              const std::string& host, const std::string& purpose, bool one_host,
                              std::string* why_not);

}  // namespace detail
}  // namespace distributed
}  // namespace lockstep
