#pragma once
/// FSDPStrategy (`--strategy fsdp`): sharded data parallel through FullyShardedDataParallel, as
/// Lightning's FSDPStrategy. `--fsdp-sharding` picks FULL_SHARD (default), SHARD_GRAD_OP,
/// SHARD_OPTIMIZER_STATE (ZeRO-1) or NO_SHARD; `--fsdp-auto-wrap-min-params` the units.

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <lockstep/distributed/sharding/fully_sharded.h>
#include <lockstep/strategies/ddp_strategy.h>

namespace lockstep {
namespace strategies {

/// Processes, launch and collectives as DDPStrategy; each module set up is wrapped in its own
/// FullyShardedDataParallel. Gradients are reduced on every backward and accumulate in the
/// shards, so accumulating batches (set_gradient_sync(false)) still communicate. Checkpoints
/// hold whole tensors, gathered from every rank: they load in Python, in one process and in DDP.
class FSDPStrategy : public DDPStrategy {
 public:
  explicit FSDPStrategy(distributed::ShardingOptions options = {});

  std::shared_ptr<WrappedModule> setup_module(const std::shared_ptr<torch::nn::Module>& module) override;
  void teardown() override;
  torch::Tensor training_step(TrainingModule& module, Batch& batch, int64_t batch_idx) override;
  void before_evaluation_step() override;
  void manual_backward(const torch::Tensor& loss) override { loss.backward(); }
  void set_gradient_sync(bool enabled) override {}

  double clip_grad_norm(const std::vector<torch::Tensor>& parameters, double max_norm, double norm_type) override;
  /// clip_grad_norm with an infinite max_norm, which clips nothing.
  double gradient_norm(const std::vector<torch::Tensor>& parameters, double norm_type) override {
    return clip_grad_norm(parameters, INFINITY, norm_type);
  }
  void check_optimizer(const torch::optim::Optimizer& optimizer) const override;
  bool shards_state() const override { return true; }
  c10::Dict<std::string, torch::Tensor> module_state_dict(const torch::nn::Module& module) override;
  void load_module_state_dict(torch::nn::Module& module, const c10::impl::GenericDict& state, bool strict) override;
  c10::impl::GenericDict optimizer_state_dict(const torch::optim::Optimizer& optimizer) override;
  void load_optimizer_state_dict(torch::optim::Optimizer& optimizer, const c10::impl::GenericDict& state) override;

  distributed::ShardingOptions& sharding_options() { return options_; }
  /// The wrapper of the module set up last (null before setup_module).
  const std::shared_ptr<distributed::FullyShardedDataParallelBase>& fsdp() const { return fsdp_; }

 private:
  /// The wrapper whose module holds `parameter`, or UsageError naming what was asked.
  distributed::FullyShardedDataParallelBase& wrapper_of(const torch::Tensor& parameter, const std::string& what) const;

  distributed::ShardingOptions options_;
  std::shared_ptr<distributed::FullyShardedDataParallelBase> fsdp_;
  std::vector<std::shared_ptr<distributed::FullyShardedDataParallelBase>> all_;
};

}  // namespace strategies
}  // namespace lockstep
