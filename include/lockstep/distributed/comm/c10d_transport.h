#pragma once
/// C10dTransport: buckets in ordinary memory, averaged with the process group's allreduce.

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

 private:
  ProcessGroup& group_;
};

}  // namespace distributed
}  // namespace lockstep
