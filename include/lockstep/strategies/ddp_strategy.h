#pragma once
/// DDPStrategy: one process per device, gradients averaged by DistributedDataParallel while
/// backward runs (seeds: Lightning's DDPPlugin, Fabric's DDPStrategy). Registered as `ddp`,
/// `ddp_fork`, `ddp_find_unused_parameters_true` and `ddp_find_unused_parameters_false`.

#include <memory>
#include <string>
#include <vector>

#include <lockstep/distributed/ddp/ddp.h>
#include <lockstep/strategies/parallel_strategy.h>

namespace lockstep {
namespace strategies {

/// Extend it to wrap the module your own way (the seed's DDPPlugin.configure_ddp):
///
///   struct MyDDP : lockstep::strategies::DDPStrategy {
///     std::shared_ptr<distributed::DistributedDataParallelBase> configure_ddp(
///         const std::shared_ptr<torch::nn::Module>& module, const std::vector<int>& device_ids) override {
///       return std::make_shared<MyWrapper>(module, process_group(), ddp_options());
///     }
///   };
///   trainer.set_strategy(std::make_shared<MyDDP>());
class DDPStrategy : public ParallelStrategy {
 public:
  /// `start_method`: as ParallelStrategy's.
  explicit DDPStrategy(distributed::DDPOptions options = {}, std::string start_method = "popen",
                       std::string name = "ddp");

  std::shared_ptr<WrappedModule> setup_module(const std::shared_ptr<torch::nn::Module>& module) override;
  void teardown() override;

  /// Wraps the module (the Trainer's TrainingModule, or the module given to Fabric::setup);
  /// override to return your own wrapper. `device_ids` is this rank's CUDA device ({} on the CPU),
  /// as PyTorch's DistributedDataParallel(device_ids=[i]); the module is already there
  /// (module_to_device). The default checks that every parameter is on it (check_on_device),
  /// and refuses a module left elsewhere, as PyTorch's DDP does.
  virtual std::shared_ptr<distributed::DistributedDataParallelBase> configure_ddp(
      const std::shared_ptr<torch::nn::Module>& module, const std::vector<int>& device_ids);

  torch::Tensor training_step(TrainingModule& module, Batch& batch, int64_t batch_idx) override;
  void manual_backward(const torch::Tensor& loss) override;
  void set_gradient_sync(bool enabled) override;

  distributed::DDPOptions& ddp_options() { return ddp_options_; }
  /// The wrapper configure_ddp returned for the module set up last (null before setup_module).
  const std::shared_ptr<distributed::DistributedDataParallelBase>& ddp() const { return ddp_; }

 protected:
  /// With sync_batchnorm: converts the module's BatchNorms, or throws UsageError naming those
  /// held by typed members, which the conversion cannot reach.
  void convert_sync_batchnorm(const std::shared_ptr<torch::nn::Module>& module);

 private:
  distributed::DDPOptions ddp_options_;
  std::shared_ptr<distributed::DistributedDataParallelBase> ddp_;
};

}  // namespace strategies
}  // namespace lockstep
