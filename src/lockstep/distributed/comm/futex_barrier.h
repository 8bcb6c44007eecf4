#pragma once
// The barrier that the ranks of one host pass together before and after they sum their slots,
// for the shared-memory allreduce (not installed).

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "shared_memory_segment.h"

namespace lockstep {
namespace distributed {
namespace detail {

/// A barrier across processes in a segment's header: the last rank to arrive bumps a futex word
/// that the others sleep on. A rank that waits checks on its peers and fails, naming them, when
/// one failed, exited or left the reduction, when it is itself stopping, or after `timeout`.
///
/// One thread of the owning rank at a time calls wait() (its communication thread, or DDP's
/// backward thread for the last bucket). It guards nothing of its own: the header's atomics are
/// shared with the other ranks' processes, and each rank writes only its own slot's entries and
/// the arrival count and futex word.
class FutexBarrier {
 public:
  /// `members`: the group ranks on this host in slot order, for messages; this rank has slot
  /// `local_rank`.
  FutexBarrier(SegmentHeader& header, std::vector<int> members, int local_rank, std::chrono::milliseconds timeout);

  /// Waits until every rank of the host has arrived at barrier `epoch` (1, 2, ... in the order
  /// the ranks call it, `phase` names it). "" when all arrived; else why not, for the caller to
  /// raise as its failure. `poll`: check for that long first, yielding the CPU to any other
  /// runnable thread between checks, and only then sleep. For a thread with nothing else to do
  /// (DDP's last bucket): a virtual CPU left idle halts, and the next step's kernels then run
  /// slower (docs/benchmarks.md section 13).
  std::string wait(const char* phase, uint64_t epoch, const std::atomic<bool>& stopping,
                   std::chrono::microseconds poll = std::chrono::microseconds(0));

 private:
  SegmentHeader& header_;
  std::vector<int> members_;
  int local_rank_;
  int local_size_;
  std::chrono::milliseconds timeout_;
};

}  // namespace detail
}  // namespace distributed
}  // namespace lockstep
