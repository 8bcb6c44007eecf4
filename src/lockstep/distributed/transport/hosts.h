#pragma once
// Which ranks share a host, for the shared-memory transport: a key per host, the ranks grouped
// by it, and the agreement on who can take part (not installed).

#include <string>
#include <vector>

#include <lockstep/distributed/process_group.h>

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

}  // namespace detail
}  // namespace distributed
}  // namespace lockstep
