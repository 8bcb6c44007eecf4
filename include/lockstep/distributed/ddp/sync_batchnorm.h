#pragma once
/// SyncBatchNorm: batch normalisation over the union of every rank's batch, and
/// convert_sync_batchnorm to put it in place of a model's BatchNorm1d/2d/3d (PyTorch's
/// torch.nn.SyncBatchNorm and SyncBatchNorm.convert_sync_batchnorm).

#include <cstdint>
#include <memory>

#include <ATen/core/Tensor.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/module.h>
#include <torch/nn/options/batchnorm.h>
#include <torch/nn/pimpl.h>

#include <lockstep/distributed/process_group.h>

namespace lockstep {
namespace distributed {

/// BatchNorm whose training-mode statistics are those of the whole distributed batch: forward
/// combines every rank's per-channel count, mean and variance (weighted by count, so ranks may
/// hold different batch sizes), backward all-reduces the two per-channel gradient sums that the
/// normalisation couples. Running statistics are updated as BatchNorm on the whole batch would
/// (unbiased variance). In eval mode, or with no group or one rank, it is plain BatchNorm. Input
/// (N, C, ...) of any rank >= 2. Parameters and buffers are named as BatchNorm's (weight, bias,
/// running_mean, running_var, num_batches_tracked), so checkpoints are interchangeable.
///
///   SyncBatchNorm bn(torch::nn::BatchNormOptions(64).momentum(0.1), group.get());
///   auto y = bn(x);  // every rank calls it with its shard, in the same order
///
/// Every rank must run the same SyncBatchNorm forwards and backwards in the same order. It does
/// not shadow its collectives for a rank that has joined (see Join): do not combine the two.
class SyncBatchNormImpl : public torch::nn::Cloneable<SyncBatchNormImpl> {
 public:
  /// `group` may be null (plain BatchNorm until set_process_group) and must outlive the module.
  explicit SyncBatchNormImpl(const torch::nn::BatchNormOptions& options, ProcessGroup* group = nullptr);
  explicit SyncBatchNormImpl(int64_t num_features, ProcessGroup* group = nullptr)
      : SyncBatchNormImpl(torch::nn::BatchNormOptions(num_features), group) {}

  /// A SyncBatchNorm over `group` that takes the options, training mode and the very tensors
  /// (parameters, running statistics) of `batchnorm`, a BatchNorm1d/2d/3d; nullptr for any
  /// other module.
  static std::shared_ptr<SyncBatchNormImpl> from_batchnorm(const std::shared_ptr<torch::nn::Module>& batchnorm,
                                                           ProcessGroup* group);

  void reset() override;
  at::Tensor forward(const at::Tensor& input);
  void pretty_print(std::ostream& stream) const override;

  void set_process_group(ProcessGroup* group) { group_ = group; }
  ProcessGroup* process_group() const { return group_; }

  torch::nn::BatchNormOptions options;
  at::Tensor weight, bias, running_mean, running_var, num_batches_tracked;

  /// Set by convert_sync_batchnorm: the BatchNorm this module replaced and its call counter at
  /// that time. DistributedDataParallel fails if that BatchNorm is still called (a typed member
  /// that the conversion could not reach).
  std::weak_ptr<torch::nn::Module> replaced;
  at::Tensor replaced_counter;
  int64_t replaced_counter_at_conversion = 0;
  std::string replaced_name;

  struct State {
    at::Tensor weight, bias, running_mean, running_var, num_batches_tracked;
  };

 private:
  SyncBatchNormImpl(const torch::nn::BatchNormOptions& options, ProcessGroup* group, const State& adopt);
  at::Tensor forward_synchronised(const at::Tensor& input, double momentum);
  ProcessGroup* group_ = nullptr;
  const State* adopt_ = nullptr;  // only while the adopting constructor runs reset()
};
TORCH_MODULE(SyncBatchNorm);

/// Replaces every BatchNorm1d/2d/3d in `module`'s tree (the module itself included) by a
/// SyncBatchNorm over `group` with the same options, parameters and buffers (same names, same
/// tensors), and returns the module (or its replacement, when `module` itself is a BatchNorm).
/// Children registered with register_module and the elements of Sequential, ModuleList and
/// ModuleDict are replaced. A forward that calls a BatchNorm through a typed member
/// (`torch::nn::BatchNorm2d bn;` then `bn(x)`) still reaches the old module, which the conversion
/// cannot rebind: DistributedDataParallel detects that at the first such forward and fails with
/// a message; declare such members as SyncBatchNorm, or call them through the module tree.
///
///   auto net = std::make_shared<torch::nn::SequentialImpl>(...);
///   convert_sync_batchnorm(net, *group);
///   DistributedDataParallel ddp(net, *group);
std::shared_ptr<torch::nn::Module> convert_sync_batchnorm(std::shared_ptr<torch::nn::Module> module,
                                                          ProcessGroup& group);

namespace detail {
/// Throws UsageError if a BatchNorm that convert_sync_batchnorm replaced in `module` has
/// run forward in training mode since, i.e. the model bypasses its SyncBatchNorm.
void check_replaced_batchnorms_unused(const torch::nn::Module& module);
/// The names of the BatchNorms that convert_sync_batchnorm replaced in `module` but that
/// something outside the module tree still holds: a typed member such as
/// `torch::nn::BatchNorm2d bn;`, whose forward would bypass the SyncBatchNorm.
std::vector<std::string> replaced_batchnorms_still_held(const torch::nn::Module& module);
}  // namespace detail

}  // namespace distributed
}  // namespace lockstep
