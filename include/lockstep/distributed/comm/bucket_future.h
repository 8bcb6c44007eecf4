#pragma once
/// BucketFuture: one bucket's reduction in flight, as comm hooks and transports return it.

#include <chrono>
#include <functional>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

namespace lockstep {
namespace distributed {

/// What a comm hook returns: the reduced bucket (the mean over ranks, shaped and typed like
/// GradBucket::buffer()), available now or once communication completes. The hook launches its
/// communication and returns at once; DDP waits at the end of backward, so the communication
/// overlaps the rest of backward.
class BucketFuture {
 public:
  /// Already reduced (a hook that computed it synchronously).
  /* implicit */ BucketFuture(at::Tensor reduced);
  /// `work` is in flight; after it completes, `finish` runs on the thread that waits and returns
  /// the reduced bucket (divides by the world size, casts back, ...).
  BucketFuture(c10::intrusive_ptr<c10d::Work> work, std::function<at::Tensor()> finish);
  /// A future whose value is a tensor or a list of tensors (the first is taken), e.g. from
  /// Work::getFuture()->then(...); `finish`, if given, maps that value to the reduced bucket.
  explicit BucketFuture(c10::intrusive_ptr<c10::ivalue::Future> future,
                        std::function<at::Tensor(const at::Tensor&)> finish = {});

  /// Blocks until the bucket is reduced, at most `timeout`; throws DistributedError if the
  /// communication failed or timed out, UsageError if a future holds no tensor. Call once.
  at::Tensor wait(std::chrono::milliseconds timeout);
  /// Calls `fn` once the communication has completed, possibly at once and possibly on a
  /// communication thread (DDP uses it to trace when each bucket finished).
  void on_completion(std::function<void()> fn);
  /// True once the communication has completed (at once for a result already computed).
  bool completed() const;

 private:
  at::Tensor reduced_;
  c10::intrusive_ptr<c10d::Work> work_;
  std::function<at::Tensor()> finish_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::function<at::Tensor(const at::Tensor&)> finish_value_;
};

}  // namespace distributed
}  // namespace lockstep
