#pragma once
/// GradientTransport: where DDP's gradient buckets live and how one bucket is averaged across
/// the ranks. The reducer orders the buckets and writes the results back; a transport gives them
/// memory and reduces them: c10d (the process group's backend, Gloo or NCCL), or shared memory
/// between the ranks of one host. Every comm hook of ddp/comm_hooks.h reduces through it.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <lockstep/distributed/comm/bucket_future.h>
#include <lockstep/distributed/process_group.h>

namespace lockstep {
namespace distributed {

class GradientTransport {
 public:
  virtual ~GradientTransport() = default;
  /// Names it in messages: "shared memory", or the process group's backend ("gloo").
  virtual std::string name() const = 0;
  /// Zeroed memory for bucket `bucket` of `numel` elements. Buckets are allocated in order from
  /// 0 each time they are (re)built; a new layout may reuse the old one's memory.
  virtual at::Tensor allocate(size_t bucket, int64_t numel, const at::TensorOptions& options) = 0;
  /// Starts averaging `buffer` (bucket `bucket`'s memory, or a stand-in of its size) across the
  /// ranks: the sum divided by `divisor`. Calls come in bucket order on every rank.
  virtual BucketFuture allreduce_mean(size_t bucket, const at::Tensor& buffer, double divisor) = 0;
  /// As allreduce_mean, for the bucket launched last in a backward pass, which nothing is left to
  /// overlap with: a transport may reduce it on the calling thread (shared memory does).
  virtual BucketFuture allreduce_mean_last(size_t bucket, const at::Tensor& buffer, double divisor) {
    return allreduce_mean(bucket, buffer, divisor);
  }
  /// As allreduce_mean, with each rank's values rounded to `compressed` (at::kHalf or
  /// at::kBFloat16; any other is a UsageError) before they are summed: the compression hooks'
  /// reduction. The result, in the buffer's dtype, ends in `buffer`. By default each rank rounds
  /// its buffer in place and averages it through allreduce_mean, so shared memory sums the rounded
  /// values in rank order (it has no wire to save bytes on); C10dTransport sends them compressed.
  virtual BucketFuture allreduce_mean_compressed(size_t bucket, const at::Tensor& buffer, double divisor,
                                                 at::ScalarType compressed);
  /// True when reducing a stand-in still goes through the bucket's own memory (shared memory),
  /// so a caller that reduces stand-ins keeps a copy of what the buckets hold.
  virtual bool reduces_through_bucket_memory() const { return false; }
  /// This rank stops reducing (an error, or its DDP is gone): peers fail at once, naming it.
  virtual void leave() {}
};

/// Shared memory when every rank can use it (`shared_memory`: DDPOptions::shared_memory; CPU
/// float32/float64 parameters, LOCKSTEP_DDP_SHARED_MEMORY not 0, more than one rank), else c10d. A collective:
/// every rank of `group` calls it for the same parameters. `why_not` receives why shared memory
/// is not used ("" when it is); rank 0 says it once per reason and process.
std::shared_ptr<GradientTransport> choose_gradient_transport(ProcessGroup& group,
                                                             const std::vector<at::Tensor>& parameters,
                                                             bool shared_memory, std::string* why_not);

}  // namespace distributed
}  // namespace lockstep
