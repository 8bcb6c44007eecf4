#include <lockstep/distributed/comm/c10d_transport.h>

#include <memory>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/torch.h>

namespace lockstep {
namespace distributed {

at::Tensor C10dTransport::allocate(size_t /*bucket*/, int64_t numel, const at::TensorOptions& options) {
  return torch::zeros({numel}, options);
}

BucketFuture C10dTransport::allreduce_mean(size_t /*bucket*/, const at::Tensor& buffer, double divisor) {
  return BucketFuture(start_sum(buffer), [buffer, divisor]() mutable { return buffer.div_(divisor); });
}

BucketFuture C10dTransport::allreduce_mean_compressed(size_t bucket, const at::Tensor& buffer, double divisor,
                                                      at::ScalarType compressed) {
  if (compressed == at::kHalf) {
    // Divide first, as torch's fp16_compress_hook does, so that the float16 sum cannot overflow.
    at::Tensor half = buffer.to(at::kHalf).div_(divisor);
    return BucketFuture(start_sum(half), [buffer, half]() mutable { return buffer.copy_(half); });
  }
  if (compressed != at::kBFloat16) return GradientTransport::allreduce_mean_compressed(bucket, buffer, divisor, compressed);
  // Gloo cannot sum bfloat16: each rank gathers the others' and sums them in float32 in rank
  // order, which gives every rank the same bits. The bits travel as float16 (same width): an
  // all-gather only copies them.
  at::Tensor carrier = buffer.to(at::kBFloat16).view(at::kHalf);
  auto gathered = std::make_shared<std::vector<std::vector<at::Tensor>>>(1);
  for (int r = 0; r < group_.world_size(); ++r) (*gathered)[0].push_back(at::empty_like(carrier));
  std::vector<at::Tensor> inputs{carrier};
  c10d::AllgatherOptions options;
  options.timeout = group_.timeout();
  auto work = group_.backend()->allgather(*gathered, inputs, options);
  return BucketFuture(std::move(work), [buffer, gathered, divisor]() mutable {
    auto sum = at::zeros(buffer.sizes(), buffer.options().dtype(at::kFloat));
    for (const auto& part : (*gathered)[0]) sum.add_(part.view(at::kBFloat16).to(at::kFloat));
    return buffer.copy_(sum.div_(divisor));
  });
}

c10::intrusive_ptr<c10d::Work> C10dTransport::start_sum(const at::Tensor& tensor) {
  c10d::AllreduceOptions options;
  options.reduceOp = c10d::ReduceOp::SUM;
  options.timeout = group_.timeout();
  std::vector<at::Tensor> tensors{tensor};
  return group_.backend()->allreduce(tensors, options);
}

}  // namespace distributed
}  // namespace lockstep
