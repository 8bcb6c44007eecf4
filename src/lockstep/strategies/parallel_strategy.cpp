#include <lockstep/strategies/parallel_strategy.h>

#include <lockstep/core/error.h>
#include <lockstep/distributed/collectives.h>
#include <lockstep/environments/cluster_environment.h>

namespace lockstep {
namespace strategies {

ParallelStrategy::ParallelStrategy(std::string start_method, std::string name) : name_(std::move(name)) {
  if (start_method != "popen" && start_method != "fork") {
    throw UsageError(name_ + ": start_method '" + start_method + "' is not one Lockstep has (spawn and "
                     "forkserver need Python's multiprocessing): use \"popen\" (re-executes the program for the "
                     "other local ranks, the default) or \"fork\".");
  }
  start_method_ = start_method == "fork" ? launchers::StartMethod::fork : launchers::StartMethod::reexec;
}

std::unique_ptr<launchers::Launcher> ParallelStrategy::launcher() {
  const auto& env = *context_.environment;
  if (env.creates_processes_externally() || context_.devices_per_node * context_.num_nodes <= 1) return nullptr;
  // Several nodes: each node's process starts its own ranks (NODE_RANK; see LocalEnvironment).
  auto options = launchers::LaunchOptions()
                     .nproc_per_node(context_.devices_per_node)
                     .nnodes(context_.num_nodes)
                     .node_rank(env.node_rank())
                     .master_addr(env.main_address())
                     .master_port(env.main_port())
                     .max_restarts(context_.max_restarts);
  if (context_.accelerator == accelerators::Accelerator::cuda) {
    // The workers use rank 0's pick (--auto-select-gpus) instead of probing again.
    std::string ids;
    for (int id : context_.gpu_ids) ids += (ids.empty() ? "" : ",") + std::to_string(id);
    options.worker_variable(accelerators::kSelectedGpusVariable, ids);
  }
  return std::make_unique<launchers::LocalLauncher>(options, start_method_);
}

void ParallelStrategy::setup_environment() {
  if (group_) return;
  const auto& env = *context_.environment;
  auto options = env.process_group_options()
                     .backend(context_.process_group_backend)
                     .timeout(std::chrono::milliseconds(static_cast<int64_t>(context_.timeout_seconds * 1000)))
                     .liveness_timeout(std::chrono::milliseconds(
                         static_cast<int64_t>(context_.liveness_timeout_seconds * 1000)))
                     .check_collectives(context_.check_collectives);
  // NCCL communicates on this rank's GPU (the connector takes nccl only with --accelerator cuda).
  if (context_.process_group_backend == "nccl") options.cuda_device(root_device().index());
  group_ = distributed::ProcessGroup::init(options);
}

distributed::ProcessGroup& ParallelStrategy::process_group() {
  if (!group_) throw UsageError(name_ + ": the process group exists only after setup_environment().");
  return *group_;
}

torch::Device ParallelStrategy::root_device() const {
  if (context_.accelerator != accelerators::Accelerator::cuda) return torch::Device(torch::kCPU);
  const int local = context_.environment ? context_.environment->local_rank() : 0;
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(context_.gpu_ids.at(static_cast<size_t>(local))));
}

std::vector<int> ParallelStrategy::device_ids() const {
  if (context_.accelerator != accelerators::Accelerator::cuda) return {};
  return {root_device().index()};
}

void ParallelStrategy::check_on_device(const torch::nn::Module& module, const std::vector<int>& device_ids) {
  LOCKSTEP_CHECK(device_ids.size() <= 1, UsageError, "DDPStrategy: device_ids names ", device_ids.size(),
                 " devices; one process trains on one device, so give one id (or none on the CPU).");
  const torch::Device device = device_ids.empty()
                                   ? torch::Device(torch::kCPU)
                                   : torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(device_ids[0]));
  for (const auto& parameter : module.named_parameters()) {
    LOCKSTEP_CHECK(parameter.value().device() == device, UsageError, "DDPStrategy: parameter '", parameter.key(),
                   "' is on ", parameter.value().device().str(), " but this rank trains on ", device.str(), " (device_ids), as "
                   "PyTorch's DistributedDataParallel(device_ids=[i]) needs its module on device i. Move the "
                   "module there (Strategy::module_to_device does), or wrap it in a configure_ddp of your own.");
  }
}

int ParallelStrategy::world_size() const { return group_ ? group_->world_size() : context_.environment->world_size(); }
int ParallelStrategy::global_rank() const { return group_ ? group_->rank() : context_.environment->global_rank(); }
int ParallelStrategy::local_rank() const { return context_.environment->local_rank(); }
int ParallelStrategy::node_rank() const { return context_.environment->node_rank(); }

torch::Tensor ParallelStrategy::all_reduce(torch::Tensor tensor, distributed::ReduceOp op) {
  return distributed::all_reduce(process_group(), tensor, op);
}

std::vector<torch::Tensor> ParallelStrategy::all_gather(const torch::Tensor& tensor) {
  return distributed::all_gather(process_group(), tensor);
}

void ParallelStrategy::barrier(const std::string& name) { distributed::barrier(process_group(), name); }

c10::IValue ParallelStrategy::broadcast(const c10::IValue& value, int src) {
  return distributed::broadcast(process_group(), value, src);
}

bool ParallelStrategy::reduce_boolean_decision(bool decision, distributed::Decision rule) {
  return distributed::reduce_boolean_decision(process_group(), decision, rule);
}

std::optional<std::pair<int, int>> ParallelStrategy::distributed_sampler_kwargs() const {
  return std::make_pair(world_size(), global_rank());
}

}  // namespace strategies
}  // namespace lockstep
