#include <lockstep/distributed/comm/c10d_transport.h>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/torch.h>

namespace lockstep {
namespace distributed {

at::Tensor C10dTransport::allocate(size_t /*bucket*/, int64_t numel, const at::TensorOptions& options) {
  return torch::zeros({numel}, options);
}

BucketFuture C10dTransport::allreduce_mean(size_t /*bucket*/, const at::Tensor& buffer, double divisor) {
  c10d::AllreduceOptions options;
  options.reduceOp = c10d::ReduceOp::SUM;
  options.timeout = group_.timeout();
  std::vector<at::Tensor> tensors{buffer};
  auto work = group_.backend()->allreduce(tensors, options);
  return BucketFuture(std::move(work), [buffer, divisor]() mutable { return buffer.div_(divisor); });
}

}  // namespace distributed
}  // namespace lockstep
