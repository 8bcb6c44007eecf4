#include <lockstep/distributed/ddp/comm_hooks.h>


#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/torch.h>

#include <lockstep/distributed/comm/c10d_transport.h>

namespace lockstep {
namespace distributed {
namespace {

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

CommHook allreduce_mean_hook() {
  return [](ProcessGroup& group, const GradBucket& bucket) -> BucketFuture {
    at::Tensor buffer = bucket.buffer();
    const int world_size = group.world_size();
    if (world_size == 1) return buffer;
    if (auto* transport = bucket.transport()) return transport->allreduce_mean(bucket.index(), buffer, world_size);
    return C10dTransport(group).allreduce_mean(bucket.index(), buffer, world_size);
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
