#include "futex_barrier.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <fstream>
#include <sstream>

#include <lockstep/distributed/comm/shared_memory_allreduce.h>  // die_after_arriving_last

namespace lockstep {
namespace distributed {
namespace detail {
namespace {

using Clock = std::chrono::steady_clock;

std::atomic<bool> die_after_arriving_last_flag{false};

long futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  // Not FUTEX_PRIVATE_FLAG: the word is shared between processes.
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

// False once `pid` has exited, zombies included (kill(pid, 0) would still succeed for those).
bool process_alive(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (stat.empty()) return false;
  const auto close = stat.rfind(')');  // the command name may hold spaces and parentheses
  if (close == std::string::npos || close + 2 >= stat.size()) return true;
  return stat[close + 2] != 'Z' && stat[close + 2] != 'X';
}

}  // namespace

void die_after_arriving_last() { die_after_arriving_last_flag = true; }

FutexBarrier::FutexBarrier(SegmentHeader& header, std::vector<int> members, int local_rank,
                           std::chrono::milliseconds timeout)
    : header_(header),
      members_(std::move(members)),
      local_rank_(local_rank),
      local_size_(static_cast<int>(members_.size())),
      timeout_(timeout) {}

std::string FutexBarrier::wait(const char* phase, uint64_t epoch, const std::atomic<bool>& stopping,
                               std::chrono::microseconds poll) {
  SegmentHeader& h = header_;
  const std::string where = std::string(" (") + phase + ", barrier " + std::to_string(epoch) + ")";
  if (const uint32_t by = h.aborted_by.load(std::memory_order_acquire)) {
    return "rank " + std::to_string(members_[by - 1]) + " failed earlier; see its output" + where;
  }
  if (h.left[local_rank_].load(std::memory_order_acquire)) return "this rank has left the reduction" + where;
  h.arrived[local_rank_].store(epoch, std::memory_order_relaxed);
  const uint32_t generation = h.generation.load(std::memory_order_acquire);
  if (h.count.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<uint32_t>(local_size_)) {
    if (die_after_arriving_last_flag.load()) _exit(0);
    h.count.store(0, std::memory_order_relaxed);
    h.generation.store(generation + 1, std::memory_order_release);
    futex(&h.generation, FUTEX_WAKE, INT_MAX, nullptr);
    return "";
  }
  for (const auto until = Clock::now() + poll; Clock::now() < until;) {
    if (h.generation.load(std::memory_order_acquire) != generation) return "";
    sched_yield();
  }
  const auto deadline = Clock::now() + timeout_;
  while (h.generation.load(std::memory_order_acquire) == generation) {
    // Sleep in slices: on a busy host spinning takes the CPU from backward.
    timespec slice{0, 20 * 1000 * 1000};
    const long rc = futex(&h.generation, FUTEX_WAIT, generation, &slice);
    if (rc == 0 || errno == EAGAIN || errno == EINTR) continue;
    const uint32_t aborted_by = h.aborted_by.load(std::memory_order_acquire);
    // Every rank's liveness, arrived or not: the last to arrive may die before it releases the rest.
    std::string missing, exited, left;
    for (int r = 0; r < local_size_; ++r) {
      const auto add = [&](std::string& list) { list += (list.empty() ? "" : ", ") + std::to_string(members_[r]); };
      if (!process_alive(h.pids[r])) {
        add(exited);
      } else if (r != local_rank_ && h.left[r].load(std::memory_order_acquire)) {
        add(left);
      }
      if (h.arrived[r].load(std::memory_order_relaxed) < epoch) add(missing);
    }
    if (h.generation.load(std::memory_order_acquire) != generation) return "";
    const std::string waiting = missing.empty() ? "" : "; waiting for rank(s) " + missing;
    if (aborted_by) return "rank " + std::to_string(members_[aborted_by - 1]) + " failed (see its output)" + waiting + where;
    if (!exited.empty()) return "rank(s) " + exited + " exited" + waiting + where;
    if (!left.empty()) {
      return "rank(s) " + left + " left the reduction (an error there, or its DistributedDataParallel or "
             "shard transport was destroyed) while their process lives on" + waiting + where + ". See those ranks' output.";
    }
    if (stopping.load()) return "stopped while waiting for rank(s) " + missing + where;
    if (Clock::now() > deadline) {
      std::ostringstream seconds;
      seconds << static_cast<double>(timeout_.count()) / 1000.0;
      return "timed out after " + seconds.str() + " s waiting for rank(s) " + missing + where +
             ". Every rank must run the same synchronised backward passes; check those ranks' output.";
    }
  }
  return "";
}

}  // namespace detail
}  // namespace distributed
}  // namespace lockstep
