#include <lockstep/distributed/comm/shared_memory_transport.h>

namespace lockstep {
namespace distributed {
namespace {

int64_t cache_line_round_up(int64_t bytes) { return (bytes + 63) / 64 * 64; }

}  // namespace

at::Tensor SharedMemoryTransport::allocate(size_t bucket, int64_t numel, const at::TensorOptions& options) {
  if (bucket == 0) {  // a new layout: from the start of the slot again
    offsets_.clear();
    next_offset_ = 0;
  }
  offsets_.resize(bucket + 1);
  offsets_[bucket] = next_offset_;
  auto region = memory_->region(next_offset_, numel, options).zero_();
  next_offset_ += cache_line_round_up(numel * static_cast<int64_t>(region.element_size()));
  return region;
}

BucketFuture SharedMemoryTransport::allreduce_mean(size_t bucket, const at::Tensor& buffer, double divisor) {
  return BucketFuture(memory_->allreduce(offsets_.at(bucket), buffer, divisor));
}

BucketFuture SharedMemoryTransport::allreduce_mean_last(size_t bucket, const at::Tensor& buffer, double divisor) {
  return BucketFuture(memory_->allreduce_here(offsets_.at(bucket), buffer, divisor));
}

int64_t SharedMemoryTransport::slot_bytes(const std::vector<at::Tensor>& parameters) {
  int64_t bytes = 64;
  for (const auto& p : parameters) bytes += cache_line_round_up(p.numel() * static_cast<int64_t>(p.element_size()));
  return bytes;
}

}  // namespace distributed
}  // namespace lockstep
