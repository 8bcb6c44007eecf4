#include <lockstep/distributed/comm_hooks.h>

#include <condition_variable>
#include <mutex>
#include <stdexcept>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/torch.h>

namespace lockstep {
namespace distributed {
namespace {

at::Tensor first_tensor(const c10::IValue& value) {
  if (value.isTensor()) return value.toTensor();
  if (value.isTensorList() && !value.toTensorList().empty()) return value.toTensorList().get(0);
  if (value.isList() && !value.toList().empty() && value.toList().get(0).isTensor()) {
    return value.toList().get(0).toTensor();
  }
  throw std::runtime_error("the comm hook's future holds a " + value.tagKind() +
                           ", not a tensor or a list of tensors.");
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
    throw std::runtime_error("the comm hook's future did not complete in time");
  }
}

c10d::AllreduceOptions sum_options(const ProcessGroup& group) {
  c10d::AllreduceOptions options;
  options.reduceOp = c10d::ReduceOp::SUM;
  options.timeout = group.timeout();
  return options;
}

}  // namespace

GradBucket::GradBucket(size_t index, bool is_last, at::Tensor buffer, std::vector<at::Tensor> parameters,
                       std::vector<std::string> parameter_names, std::vector<at::Tensor> gradients)
    : index_(index),
      is_last_(is_last),
      buffer_(std::move(buffer)),
      parameters_(std::move(parameters)),
      parameter_names_(std::move(parameter_names)),
      gradients_(std::move(gradients)) {}

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
    if (future_->hasError()) throw std::runtime_error(future_->tryRetrieveErrorMessage());
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

CommHook allreduce_mean_hook() {
  return [](ProcessGroup& group, const GradBucket& bucket) -> BucketFuture {
    at::Tensor buffer = bucket.buffer();
    const int world_size = group.world_size();
    if (world_size == 1) return buffer;
    if (auto* shared = bucket.shared_memory()) {
      return BucketFuture(shared->allreduce(bucket.shared_memory_offset(), buffer, world_size));
    }
    std::vector<at::Tensor> tensors{buffer};
    auto work = group.backend()->allreduce(tensors, sum_options(group));
    return BucketFuture(std::move(work), [buffer, world_size]() mutable { return buffer.div_(world_size); });
  };
}

CommHook fp16_compress_hook() {
  return [](ProcessGroup& group, const GradBucket& bucket) -> BucketFuture {
    at::Tensor buffer = bucket.buffer();
    // Divide first, as torch's hook does, so that the float16 sum cannot overflow.
    at::Tensor compressed = buffer.to(at::kHalf).div_(group.world_size());
    std::vector<at::Tensor> tensors{compressed};
    auto work = group.backend()->allreduce(tensors, sum_options(group));
    return BucketFuture(std::move(work), [buffer, compressed]() mutable { return buffer.copy_(compressed); });
  };
}

CommHook bf16_compress_hook() {
  return [](ProcessGroup& group, const GradBucket& bucket) -> BucketFuture {
    at::Tensor buffer = bucket.buffer();
    const int world_size = group.world_size();
    // The bfloat16 bits travel as float16 (same width): all_gather only copies them.
    at::Tensor carrier = buffer.to(at::kBFloat16).view(at::kHalf);
    auto gathered = std::make_shared<std::vector<std::vector<at::Tensor>>>(1);
    for (int r = 0; r < world_size; ++r) (*gathered)[0].push_back(at::empty_like(carrier));
    std::vector<at::Tensor> inputs{carrier};
    c10d::AllgatherOptions options;
    options.timeout = group.timeout();
    auto work = group.backend()->allgather(*gathered, inputs, options);
    return BucketFuture(std::move(work), [buffer, gathered, world_size]() mutable {
      auto sum = at::zeros(buffer.sizes(), buffer.options().dtype(at::kFloat));
      for (const auto& part : (*gathered)[0]) sum.add_(part.view(at::kBFloat16).to(at::kFloat));
      return buffer.copy_(sum.div_(world_size));
    });
  };
}

}  // namespace distributed
}  // namespace lockstep
