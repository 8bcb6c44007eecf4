#pragma once
/// DDPStrategy: one process per device, gradients averaged by DistributedDataParallel while
/// backward runs (seeds: Lightning's DDPPlugin, Fabric's DDPStrategy). Registered as `ddp`,
/// `ddp_fork`, `ddp_find_unused_parameters_true` and `ddp_find_unused_parameters_false`.

#include <memory>
#include <string>
#include <vector>

#include <lockstep/distributed/ddp.h>
#include <lockstep/distributed/process_group.h>
#include <lockstep/launchers/local_launcher.h>
#include <lockstep/strategies/strategy.h>

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
class DDPStrategy : public Strategy {
 public:
  /// `start_method` "popen" re-executes the program for the other local ranks; "fork" forks
  /// (must happen before LibTorch starts threads); any other is a UsageError.
  explicit DDPStrategy(distributed::DDPOptions options = {}, std::string start_method = "popen",
                       std::string name = "ddp");

  std::string name() const override { return name_; }
  std::unique_ptr<launchers::Launcher> launcher() override;
  void setup_environment() override;
  torch::Device root_device() const override;
  std::shared_ptr<WrappedModule> setup_module(const std::shared_ptr<torch::nn::Module>& module) override;
  void teardown() override;

  /// Wraps the module (the Trainer's TrainingModule, or the module given to Fabric::setup);
  /// override to return your own wrapper. `device_ids` is this rank's CUDA device ({} on the CPU),
  /// as PyTorch's DistributedDataParallel(device_ids=[i]); the module is already there
  /// (module_to_device). The default checks that every parameter is on it (check_on_device),
  /// and refuses a module left elsewhere, as PyTorch's DDP does.
  virtual std::shared_ptr<distributed::DistributedDataParallelBase> configure_ddp(
      const std::shared_ptr<torch::nn::Module>& module, const std::vector<int>& device_ids);
  /// UsageError unless every parameter of `module` is on device_ids' device (the CPU when empty).
  static void check_on_device(const torch::nn::Module& module, const std::vector<int>& device_ids);

  torch::Tensor training_step(TrainingModule& module, Batch& batch, int64_t batch_idx) override;
  void manual_backward(const torch::Tensor& loss) override;
  void set_gradient_sync(bool enabled) override;

  int world_size() const override;
  int global_rank() const override;
  int local_rank() const override;
  int node_rank() const override;
  torch::Tensor all_reduce(torch::Tensor tensor, distributed::ReduceOp op = distributed::ReduceOp::mean) override;
  std::vector<torch::Tensor> all_gather(const torch::Tensor& tensor) override;
  void barrier(const std::string& name) override;
  c10::IValue broadcast(const c10::IValue& value, int src = 0) override;
  bool reduce_boolean_decision(bool decision, distributed::Decision rule = distributed::Decision::all) override;
  std::optional<std::pair<int, int>> distributed_sampler_kwargs() const override;

  distributed::DDPOptions& ddp_options() { return ddp_options_; }
  distributed::ProcessGroup& process_group();
  std::shared_ptr<distributed::ProcessGroup> group() const override { return group_; }
  /// The wrapper configure_ddp returned for the module set up last (null before setup_module).
  const std::shared_ptr<distributed::DistributedDataParallelBase>& ddp() const { return ddp_; }

 protected:
  /// With sync_batchnorm: converts the module's BatchNorms, or throws UsageError naming those
  /// held by typed members, which the conversion cannot reach.
  void convert_sync_batchnorm(const std::shared_ptr<torch::nn::Module>& module);

 private:
  distributed::DDPOptions ddp_options_;
  launchers::StartMethod start_method_;
  std::string name_;
  std::shared_ptr<distributed::ProcessGroup> group_;
  std::shared_ptr<distributed::DistributedDataParallelBase> ddp_;
};

}  // namespace strategies
}  // namespace lockstep
