#pragma once
/// C10dTransport: buckets in ordinary memory, averaged with the process group's allreduce;
/// compressed ones travel as float16 (an allreduce) or bfloat16 (an all-gather: Gloo cannot sum it).

#include <lockstep/distributed/comm/gradient_transport.h>

namespace lockstep {
namespace distributed {

class C10dTransport : public GradientTransport {
 public:
  /// `group` must outlive the transport.
  explicit C10dTransport(ProcessGroup& group) : group_(group) {}
  std::string name() const override { return group_.backend_name(); }
  at::Tensor allocate(size_t bucket, int64_t numel, const at::TensorOptions& options) override;
  BucketFuture allreduce_mean(size_t bucket, const at::Tensor& buffer, double divisor) override;
  BucketFuture allreduce_mean_compressed(size_t bucket, const at::Tensor& buffer, double divisor,
                                         at::ScalarType compressed) override;

 private:
  /// Starts summing `tensor` in place over the group.
  c10::intrusive_ptr<c10d::Work> start_sum(const at::Tensor& tensor);

  ProcessGroup& group_;
};

}  // namespace distributed
}  // namespace lockstep
