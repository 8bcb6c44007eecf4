#pragma once
/// SharedMemoryTransport: buckets in the shared memory of the ranks of each host, averaged there
/// (and across hosts over the backend) by SharedMemoryAllreduce.

#include <memory>
#include <vector>

#include <lockstep/distributed/comm/gradient_transport.h>
#include <lockstep/distributed/comm/shared_memory_allreduce.h>

namespace lockstep {
namespace distributed {

class SharedMemoryTransport : public GradientTransport {
 public:
  explicit SharedMemoryTransport(std::shared_ptr<SharedMemoryAllreduce> memory) : memory_(std::move(memory)) {}
  std::string name() const override { return memory_->describe(); }
  /// Buckets back to back in this rank's slot, each starting on a cache line.
  at::Tensor allocate(size_t bucket, int64_t numel, const at::TensorOptions& options) override;
  BucketFuture allreduce_mean(size_t bucket, const at::Tensor& buffer, double divisor) override;
  /// On the calling thread: SharedMemoryAllreduce::allreduce_here.
  BucketFuture allreduce_mean_last(size_t bucket, const at::Tensor& buffer, double divisor) override;
  bool reduces_through_bucket_memory() const override { return true; }
  void leave() override { memory_->leave(); }

  /// Bytes of one rank's slot for buckets holding `parameters` (each bucket cache-line aligned).
  static int64_t slot_bytes(const std::vector<at::Tensor>& parameters);

 private:
  std::shared_ptr<SharedMemoryAllreduce> memory_;
  std::vector<int64_t> offsets_;  // bucket -> byte offset in the slot
  int64_t next_offset_ = 0;
};

}  // namespace distributed
}  // namespace lockstep
