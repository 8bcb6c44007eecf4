#pragma once
/// ParallelStrategy: what every strategy with one process per device shares (Lightning's
/// ParallelStrategy): the launcher, the process group, this rank's place and the collectives.
/// DDPStrategy (and SeparateDDPStrategy) and FSDPStrategy stand beside each other on it; each adds
/// how it wraps the module.

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <lockstep/distributed/process_group.h>
#include <lockstep/launchers/local_launcher.h>
#include <lockstep/strategies/strategy.h>

namespace lockstep {
namespace strategies {

class ParallelStrategy : public Strategy {
 public:
  /// `start_method` "popen" re-executes the program for the other local ranks; "fork" forks
  /// (must happen before LibTorch starts threads); any other is a UsageError naming `name`.
  ParallelStrategy(std::string start_method, std::string name);

  std::string name() const override { return name_; }
  std::unique_ptr<launchers::Launcher> launcher() override;
  void setup_environment() override;
  torch::Device root_device() const override;

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

  /// The ranks' process group; UsageError before setup_environment().
  distributed::ProcessGroup& process_group();
  std::shared_ptr<distributed::ProcessGroup> group() const override { return group_; }
  /// UsageError unless every parameter of `module` is on device_ids' device (the CPU when empty).
  static void check_on_device(const torch::nn::Module& module, const std::vector<int>& device_ids);

 protected:
  /// This rank's CUDA device as PyTorch's DistributedDataParallel(device_ids=[i]) takes it; {} on the CPU.
  std::vector<int> device_ids() const;

 private:
  launchers::StartMethod start_method_;
  std::string name_;
  std::shared_ptr<distributed::ProcessGroup> group_;
};

}  // namespace strategies
}  // namespace lockstep
