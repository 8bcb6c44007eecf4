#include "wait_for.h"

#include <algorithm>
#include <iostream>
#include <sstream>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <lockstep/core/error.h>

namespace lockstep {
namespace distributed {
namespace detail {

std::chrono::milliseconds timeout_of(const ProcessGroup& group, const CollectiveOptions& options) {
  return options.timeout().count() > 0 ? options.timeout() : group.timeout();
}

std::string call_name(const std::string& op, const CollectiveOptions& options) {
  return options.tag().empty() ? op : op + " '" + options.tag() + "'";
}

std::string seconds(std::chrono::milliseconds t) {
  std::ostringstream out;
  out << static_cast<double>(t.count()) / 1000.0 << " s";
  return out.str();
}

// Gloo's wait can be resumed after a shorter one: that is what lets the warning come first.
void wait_for(const ProcessGroup& group, const c10::intrusive_ptr<c10d::Work>& work,
              const std::string& op, const CollectiveOptions& options,
              const std::function<std::string()>& who_arrived) {
  const auto timeout = timeout_of(group, options);
  std::string unreachable;  // hosts found not answering at the warning
  try {
    if (group.backend_name() == "gloo") {
      // Never 0 ms: c10d's wait takes 0 for "no timeout".
      const auto warn_after = std::max(timeout / 4, std::chrono::milliseconds(1));
      try {
        work->wait(warn_after);
        return;
      } catch (const std::exception&) {
        if (work->isCompleted()) throw;  // it failed, rather than went on
      }
      const auto warned_at = std::chrono::steady_clock::now();
      unreachable = group.unreachable_members();
      // One write: ranks that are threads of one process must not interleave their lines.
      std::cerr << "lockstep: " + group.describe() + ": still waiting in " + call_name(op, options) + " after " +
                       seconds(warn_after) + "; " +
                       (!unreachable.empty() ? unreachable
                        : who_arrived        ? who_arrived()
                                             : std::string("a rank has not arrived or is in another collective (run "
                                                           "with LOCKSTEP_DISTRIBUTED_DEBUG=detail to see which)")) +
                       "; it fails in " + seconds(timeout - warn_after) + ".\n";
      const auto probed = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - warned_at);
      work->wait(std::max(timeout - warn_after - probed, std::chrono::milliseconds(1)));
      return;
    }
    work->wait(timeout);
  } catch (const std::exception& e) {
    const std::string why = unreachable.empty() ? "Every rank must make the same collective calls in the same order; "
                                                  "check the other ranks' output for an earlier error."
                                                : "Unreachable: " + unreachable + ".";
    throw DistributedError(group.describe() + ": " + call_name(op, options) + " did not complete (timeout " +
                           seconds(timeout) + "): " + message_of(e) + "\n" + why);
  }
}

}  // namespace detail
}  // namespace distributed
}  // namespace lockstep
