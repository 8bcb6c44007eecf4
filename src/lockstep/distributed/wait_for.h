#pragma once
// Waiting for one c10d work item within a collective's timeout, shared by the collectives and the
// shard transports (not installed).

#include <chrono>
#include <functional>
#include <string>

#include <c10/util/intrusive_ptr.h>

#include <lockstep/distributed/collectives.h>
#include <lockstep/distributed/process_group.h>

namespace c10d {
class Work;
}  // namespace c10d

namespace lockstep {
namespace distributed {
namespace detail {

/// The options' timeout, or the group's when the options give none.
std::chrono::milliseconds timeout_of(const ProcessGroup& group, const CollectiveOptions& options);
/// "all_reduce(sum)", or "all_reduce(sum) 'sync_dist val_loss'" with a tag.
std::string call_name(const std::string& op, const CollectiveOptions& options);
/// "0.4 s".
std::string seconds(std::chrono::milliseconds t);

/// Waits for `work`; a timeout or a dead peer becomes a DistributedError naming this rank and the
/// call (`op` and the options' tag). Over Gloo, a quarter of the timeout in, a line on stderr says
/// what this rank waits in and, where given, which ranks arrived (`who_arrived`).
void wait_for(const ProcessGroup& group, const c10::intrusive_ptr<c10d::Work>& work, const std::string& op,
              const CollectiveOptions& options, const std::function<std::string()>& who_arrived = nullptr);

}  // namespace detail
}  // namespace distributed
}  // namespace lockstep
