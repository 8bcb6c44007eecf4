#include <lockstep/distributed/comm/bucket_future.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>

#include <lockstep/core/error.h>
#include <lockstep/distributed/distributed_error.h>

namespace lockstep {
namespace distributed {
namespace {

at::Tensor first_tensor(const c10::IValue& value) {
  if (value.isTensor()) return value.toTensor();
  if (value.isTensorList() && !value.toTensorList().empty()) return value.toTensorList().get(0);
  if (value.isList() && !value.toList().empty() && value.toList().get(0).isTensor()) {
    return value.toList().get(0).toTensor();
  }
  throw UsageError("the comm hook's future holds a " + value.tagKind() +
                   ", not a tensor or a list of tensors; complete it with the reduced bucket, e.g. "
                   "work->getFuture() of an allreduce of bucket.buffer().");
}

// Waits for a c10 future for at most `timeout` (ivalue::Future::wait has no timeout).
void wait_with_timeout(const c10::intrusive_ptr<c10::ivalue::Future>& future, std::chrono::milliseconds timeout) {
  struct Signal {
    std::mutex mutex;
    std::condition_variable cv;
    bool done = false;
  };
  auto signal = std::make_shared<Signal>();
  future->addCallback([signal](c10::ivalue::Future&) {
    {
      std::lock_guard<std::mutex> lock(signal->mutex);
      signal->done = true;
    }
    signal->cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(signal->mutex);
  if (!signal->cv.wait_for(lock, timeout, [&] { return signal->done; })) {
    throw DistributedError("the comm hook's future did not complete within " + std::to_string(timeout.count()) +
                           " ms; a rank may have died or stopped calling backward. Check the other ranks' logs, "
                           "or raise the process group's timeout.");
  }
}

}  // namespace

BucketFuture::BucketFuture(at::Tensor reduced) : reduced_(std::move(reduced)) {}

BucketFuture::BucketFuture(c10::intrusive_ptr<c10d::Work> work, std::function<at::Tensor()> finish)
    : work_(std::move(work)), finish_(std::move(finish)) {}

BucketFuture::BucketFuture(c10::intrusive_ptr<c10::ivalue::Future> future,
                           std::function<at::Tensor(const at::Tensor&)> finish)
    : future_(std::move(future)), finish_value_(std::move(finish)) {}

at::Tensor BucketFuture::wait(std::chrono::milliseconds timeout) {
  if (work_) {
    work_->wait(timeout);
    return finish_ ? finish_() : at::Tensor();
  }
  if (future_) {
    wait_with_timeout(future_, timeout);
    if (future_->hasError()) {
      throw DistributedError("the comm hook's future completed with an error: " + future_->tryRetrieveErrorMessage());
    }
    auto value = first_tensor(future_->value());
    return finish_value_ ? finish_value_(value) : value;
  }
  return reduced_;
}

void BucketFuture::on_completion(std::function<void()> fn) {
  if (future_) {
    future_->addCallback([fn](c10::ivalue::Future&) { fn(); });
    return;
  }
  if (work_) {
    work_->getFuture()->addCallback([fn](c10::ivalue::Future&) { fn(); });
    return;
  }
  fn();
}

bool BucketFuture::completed() const {
  if (future_) return future_->completed();
  if (work_) return work_->isCompleted();
  return true;
}

}  // namespace distributed
}  // namespace lockstep
