#pragma once
/// SharedMemoryShardTransport: the collectives of sharded training between the ranks of one
/// host, through a shared memory segment with one slot per rank (the segment and the futex
/// barrier of SharedMemoryAllreduce). A reduce-scatter: every rank copies its flat into its slot,
/// then rank r sums part r over all slots in rank order into its shard. An all-gather: every rank
/// copies its shard into its slot, then all slots into its flat. A flat larger than a slot goes
/// through in chunks (the same chunk of every shard at a time).

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include <lockstep/distributed/comm/shard_transport.h>
#include <lockstep/distributed/process_group.h>

namespace lockstep {
namespace distributed {

class SharedMemoryShardTransport : public ShardTransport {
 public:
  /// A collective over `group`: every rank gets a transport whose slot holds `max_flat_bytes`,
  /// or every rank gets nullptr and `why_not` says why (a rank that `refused` with a reason, a
  /// single rank, ranks on several hosts, memory that could not be shared). `host` names this
  /// rank's host; default: this machine (tests pass others). Calls must come one at a time, in
  /// the same order on every rank; `group` must outlive the transport. Tensors other than
  /// contiguous CPU float32, float64 and bfloat16 go through c10d_shard_transport(group).
  static std::shared_ptr<SharedMemoryShardTransport> connect(ProcessGroup& group, int64_t max_flat_bytes,
                                                             const std::string& refused = "",
                                                             std::string* why_not = nullptr,
                                                             const std::string& host = "");
  ~SharedMemoryShardTransport() override;
  SharedMemoryShardTransport(const SharedMemoryShardTransport&) = delete;
  SharedMemoryShardTransport& operator=(const SharedMemoryShardTransport&) = delete;

  std::string name() const override { return "shared memory"; }
  void reduce_scatter(const FlatSegments& flat, at::Tensor& shard, double divisor, const std::string& what) override;
  void reduce_scatter_add(const FlatSegments& flat, at::Tensor& shard, double divisor, const std::string& what) override;
  void all_gather(const at::Tensor& shard, at::Tensor& flat, const std::string& what) override;

  /// The bytes of one rank's slot: max_flat_bytes rounded up to whole pages.
  int64_t slot_bytes() const;
  /// Marks this rank as gone (also done by the destructor): peers waiting for it fail at once,
  /// naming it, instead of waiting out the timeout. Its own later calls fail.
  void leave();

 private:
  struct Segment;
  enum class Operation : int64_t { reduce_scatter = 1, all_gather = 2 };

  SharedMemoryShardTransport(std::unique_ptr<Segment> segment, int rank, int world_size, std::string who,
                             std::shared_ptr<ShardTransport> fallback);
  template <typename T>
  void reduce_scatter_in_chunks(const FlatSegments& flat, T* shard, int64_t shard_numel, T divisor,
                             const std::string& what, bool add);
  /// reduce_scatter (`add`: reduce_scatter_add) for the tensors shared memory sums itself.
  void reduce_scatter_typed(const FlatSegments& flat, at::Tensor& shard, double divisor, const std::string& what,
                            bool add);
  template <typename T>
  void all_gather_in_chunks(const T* shard, T* flat, int64_t shard_numel, const std::string& what);
  // Says which call this rank is in, for check_same_call after the first barrier.
  void announce(Operation operation, int64_t shard_numel, at::ScalarType dtype);
  void check_same_call(const std::string& what);
  void barrier(const std::string& what, const char* phase);
  [[noreturn]] void fail(const std::string& what, const std::string& failure);

  std::unique_ptr<Segment> segment_;
  int rank_;
  int world_size_;
  std::string who_;  // "rank 1/2", for messages
  std::shared_ptr<ShardTransport> fallback_;  // c10d, for tensors shared memory does not take
  uint64_t epoch_ = 0;
  std::string broken_;  // after a failure the ranks are out of step: every later call fails too
  std::atomic<bool> stopping_{false};  // never set: the barrier's wait takes one
};

}  // namespace distributed
}  // namespace lockstep
