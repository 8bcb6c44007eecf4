#pragma once
/// SharedMemoryAllreduce: DDP's gradient transport between ranks on one host. The ranks of a
/// host map one shared memory segment; a rank's gradient buckets live in its own slot of it, and
/// a bucket is averaged in place: rank r sums part r of the bucket over all slots (in rank order,
/// so every rank gets the same bits) and writes the mean into every slot. That replaces Gloo's
/// loopback TCP, which costs about ten times the CPU, for the one collective that moves most
/// bytes. With several hosts, rank r of each host also sums part r across hosts over the
/// process group's backend. Everything else still goes through the process group.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/util/intrusive_ptr.h>

#include <lockstep/distributed/process_group.h>

namespace lockstep {
namespace distributed {

class SharedMemoryAllreduce {
 public:
  /// A collective over `group`: every rank gets a transport whose slot holds `bytes_per_rank`
  /// bytes, or every rank gets nullptr and `why_not` says why (a rank that `refused` with a
  /// reason, a host with one rank only, hosts with different numbers of ranks, memory that
  /// could not be shared). Ranks share a segment with the ranks on their host; with several
  /// hosts, each part of a bucket is also summed across hosts over the backend, by one rank per
  /// host. `host` names this rank's host; default: this machine (hostname, boot and process
  /// namespace; tests pass others). A segment is an anonymous memfd: nothing is left in
  /// /dev/shm, whatever happens to the ranks.
  static std::shared_ptr<SharedMemoryAllreduce> connect(ProcessGroup& group, int64_t bytes_per_rank,
                                                        const std::string& refused = "",
                                                        std::string* why_not = nullptr,
                                                        const std::string& host = "");
  ~SharedMemoryAllreduce();
  SharedMemoryAllreduce(const SharedMemoryAllreduce&) = delete;
  SharedMemoryAllreduce& operator=(const SharedMemoryAllreduce&) = delete;

  /// `numel` elements of `options`' dtype at `offset` bytes into this rank's slot (the memory
  /// stays mapped while the tensor lives). `offset` must be a multiple of 64.
  at::Tensor region(int64_t offset, int64_t numel, const at::TensorOptions& options);

  /// Starts averaging the region at `offset` (`tensor`'s numel and dtype, float or double)
  /// over the ranks: the sum in rank order, divided by `divisor`. If `tensor` is that region it
  /// is reduced in place; otherwise it is copied in and the result copied back. Calls run in
  /// order on one communication thread; the future completes with `tensor`, or with an error
  /// naming this rank, the ranks that did not arrive and the timeout.
  c10::intrusive_ptr<c10::ivalue::Future> allreduce(int64_t offset, at::Tensor tensor, double divisor);
  /// As allreduce, on the calling thread once the calls queued before it are done; the future
  /// it returns has completed. For a reduction nothing is left to overlap with (DDP's last
  /// bucket): it saves the hand-over to the communication thread and back. Its waits for the
  /// other ranks check for up to 1 ms, yielding the CPU, before they sleep: a CPU left idle that
  /// briefly halts on a virtual machine and slows the next step (docs/benchmarks.md section 13).
  c10::intrusive_ptr<c10::ivalue::Future> allreduce_here(int64_t offset, at::Tensor tensor, double divisor);

  int64_t bytes_per_rank() const;
  /// How buckets travel: "shared memory" on one host; with several, "shared memory within each
  /// host, gloo across 2 hosts".
  std::string describe() const;

  /// Marks this rank as gone from the reduction (also done by the destructor): peers waiting for
  /// it fail at once, naming it, instead of waiting out the timeout. Its own later calls fail.
  void leave();

 private:
  struct Segment;
  struct Job {
    int64_t offset;
    at::Tensor tensor;
    double divisor;
    c10::intrusive_ptr<c10::ivalue::Future> future;
    bool on_caller_thread = false;  // allreduce_here's: its barriers poll before they sleep
  };

  SharedMemoryAllreduce(std::shared_ptr<Segment> segment, std::vector<int> members, int local_rank,
                        std::shared_ptr<ProcessGroup> across, std::string who, std::chrono::milliseconds timeout);
  Job make_job(int64_t offset, at::Tensor tensor, double divisor);
  void run();
  void finish(const Job& job);
  void reduce(const Job& job);
  void barrier(const char* phase, bool poll);
  void check_same_job();
  [[noreturn]] void fail_all(const std::string& what);
  template <typename T>
  std::vector<T*> slots_of(int64_t offset) const;

  std::shared_ptr<Segment> segment_;
  std::vector<int> members_;  // the group ranks on this host, in rank order: slot r is members_[r]'s
  int local_rank_;
  int local_size_;
  std::shared_ptr<ProcessGroup> across_;  // rank local_rank_ of every host; null on one host
  std::string who_;  // "rank 1/2", for messages
  std::chrono::milliseconds timeout_;
  // One thread at a time reduces (busy_): thread_ (run()) or allreduce_here's caller. They alone
  // touch epoch_, broken_ and the segment's slots and barrier.
  uint64_t epoch_ = 0;
  std::string broken_;  // after a failure the ranks are out of step: every later call fails too

  // Guards jobs_ and busy_: allreduce() queues from the backward pass's thread; thread_ takes
  // them in order.
  std::mutex mutex_;
  std::condition_variable wake_;  // a job queued, or stopping
  std::condition_variable idle_;  // busy_ cleared
  std::deque<Job> jobs_;
  bool busy_ = false;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

namespace detail {
/// For tests of a peer that dies inside a barrier: the next time this process is the last to
/// arrive at a barrier, it exits (_exit(0)) after arriving and before releasing the others.
void die_after_arriving_last();
}  // namespace detail

}  // namespace distributed
}  // namespace lockstep
