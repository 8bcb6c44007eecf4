#pragma once
/// Communication hooks: how DDP reduces one bucket of gradients across the ranks. The default
/// averages with an allreduce; fp16_compress_hook and bf16_compress_hook round the gradients to
/// 16 bits; a user may supply any callable of the same shape (PyTorch's register_comm_hook). The
/// built-in hooks reduce through the bucket's transport, so shared memory stays on with them.

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include <lockstep/distributed/comm/bucket_future.h>
#include <lockstep/distributed/comm/gradient_transport.h>
#include <lockstep/distributed/process_group.h>

namespace lockstep {
namespace distributed {

/// One bucket of gradients, as a comm hook sees it: a flat buffer holding this rank's gradients
/// of some parameters, back to back, in the order of parameters().
class GradBucket {
 public:
  GradBucket(size_t index, bool is_last, at::Tensor buffer, std::vector<at::Tensor> parameters,
             std::vector<std::string> parameter_names, std::vector<at::Tensor> gradients);

  /// Position of the bucket; buckets are reduced in this order on every rank.
  size_t index() const { return index_; }
  /// True for the bucket whose reduction is launched last in a backward pass.
  bool is_last() const { return is_last_; }
  /// The flat gradients of this rank (1-D, one dtype). A hook may reduce it in place.
  const at::Tensor& buffer() const { return buffer_; }
  /// The parameters whose gradients the buffer holds.
  const std::vector<at::Tensor>& parameters() const { return parameters_; }
  /// Their names, as in named_parameters() ("fc2.weight").
  const std::vector<std::string>& parameter_names() const { return parameter_names_; }
  /// Views into buffer(), one per parameter, shaped like it.
  const std::vector<at::Tensor>& gradients() const { return gradients_; }

  /// The transport DDP keeps its buckets with (shared memory or the process group's backend);
  /// the built-in hooks average through it. nullptr for a bucket made outside DDP.
  GradientTransport* transport() const { return transport_.get(); }
  void set_transport(std::shared_ptr<GradientTransport> transport) { transport_ = std::move(transport); }

 private:
  size_t index_;
  bool is_last_;
  at::Tensor buffer_;
  std::vector<at::Tensor> parameters_;
  std::vector<std::string> parameter_names_;
  std::vector<at::Tensor> gradients_;
  std::shared_ptr<GradientTransport> transport_;
};


/// A communication hook: called on the backward thread when a bucket is full (buckets in index
/// order), it starts reducing `bucket` over `group` and returns the future mean. It must make
/// the same collective calls on every rank.
///
///   DDPOptions().comm_hook([](ProcessGroup& group, const GradBucket& bucket) -> BucketFuture {
///     auto local = bucket.buffer().clone();  // e.g. no communication at all
///     return local;
///   });
using CommHook = std::function<BucketFuture(ProcessGroup& group, const GradBucket& bucket)>;

/// The default: the bucket's transport sums the buffer in place across the ranks, then divides
/// by the world size (shared memory between ranks of one host, else the process group).
CommHook allreduce_mean_hook();
/// Rounds each rank's gradients to float16 (~3 decimal digits) and averages them through the
/// bucket's transport (GradientTransport::allreduce_mean_compressed). Over the process group
/// the float16 values travel, divided by the world size first, and are summed in float16: half
/// the bytes (torch's fp16_compress_hook). In shared memory, with no wire to save bytes on, the
/// rounded values are summed in the bucket's dtype in rank order, as every bucket is there.
CommHook fp16_compress_hook();
/// As fp16_compress_hook with bfloat16: float32's range, ~2 decimal digits. Gloo cannot sum
/// bfloat16, so over the process group each rank all-gathers the others' bfloat16 buffers and
/// sums them in float32 in rank order; shared memory sums the same values in the same order (the
/// same bits for float32 parameters on one host).
CommHook bf16_compress_hook();

}  // namespace distributed
}  // namespace lockstep
