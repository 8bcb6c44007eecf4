#include <lockstep/strategies/ddp_strategy.h>

#include <lockstep/core/training_module.h>
#include <lockstep/core/error.h>
#include <lockstep/environments/cluster_environment.h>
#include <lockstep/launchers/local_launcher.h>
#include <lockstep/strategies/registry.h>
#include <lockstep/distributed/sync_batchnorm.h>

namespace lockstep {
namespace strategies {
namespace {

const bool ddp_registered = [] {
  using distributed::DDPOptions;
  register_strategy("ddp", [] { return std::make_shared<DDPStrategy>(); },
                    "one process per device; re-executes the program for the other local ranks");
  register_strategy("ddp_fork", [] { return std::make_shared<DDPStrategy>(DDPOptions(), "fork", "ddp_fork"); },
                    "ddp, forking instead of re-executing");
  register_strategy("ddp_find_unused_parameters_true",
                    [] {
                      return std::make_shared<DDPStrategy>(DDPOptions().find_unused_parameters(true), "popen",
                                                           "ddp_find_unused_parameters_true");
                    },
                    "ddp for models whose forward skips parameters");
  register_strategy("ddp_find_unused_parameters_false",
                    [] {
                      return std::make_shared<DDPStrategy>(DDPOptions().find_unused_parameters(false), "popen",
                                                           "ddp_find_unused_parameters_false");
                    },
                    "ddp (every parameter gets a gradient every step)");
  return true;
}();

// Fabric's view of one DistributedDataParallel.
class DDPModule : public WrappedModule {
 public:
  explicit DDPModule(std::shared_ptr<distributed::DistributedDataParallelBase> ddp) : ddp_(std::move(ddp)) {}
  void before_forward() override { ddp_->prepare_forward(); }
  void after_forward(const std::vector<at::Tensor>& outputs, bool known) override {
    ddp_->finish_forward_tensors(outputs, known);
  }
  bool gradient_sync() const override { return ddp_->require_backward_grad_sync(); }
  void set_gradient_sync(bool enabled) override { ddp_->set_require_backward_grad_sync(enabled); }

 private:
  std::shared_ptr<distributed::DistributedDataParallelBase> ddp_;
};

}  // namespace

DDPStrategy::DDPStrategy(distributed::DDPOptions options, std::string start_method, std::string name)
    : ddp_options_(std::move(options)), name_(std::move(name)) {
  if (start_method != "popen" && start_method != "fork") {
    throw UsageError("DDPStrategy start_method '" + start_method + "' is not one Lockstep has (spawn and "
                     "forkserver need Python's multiprocessing): use \"popen\" (re-executes the program for the "
                     "other local ranks, the default) or \"fork\".");
  }
  start_method_ = start_method == "fork" ? launchers::StartMethod::fork : launchers::StartMethod::reexec;
}

std::unique_ptr<launchers::Launcher> DDPStrategy::launcher() {
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

void DDPStrategy::setup_environment() {
  if (group_) return;
  const auto& env = *context_.environment;
  auto options = env.process_group_options()
                     .backend(context_.process_group_backend)
                     .timeout(std::chrono::milliseconds(static_cast<int64_t>(context_.timeout_seconds * 1000)))
                     .check_collectives(context_.check_collectives);
  // NCCL communicates on this rank's GPU (the connector takes nccl only with --accelerator cuda).
  if (context_.process_group_backend == "nccl") options.cuda_device(root_device().index());
  group_ = distributed::ProcessGroup::init(options);
}

distributed::ProcessGroup& DDPStrategy::process_group() {
  if (!group_) throw UsageError("DDPStrategy: the process group exists only after setup_environment().");
  return *group_;
}

torch::Device DDPStrategy::root_device() const {
  if (context_.accelerator != accelerators::Accelerator::cuda) return torch::Device(torch::kCPU);
  const int local = context_.environment ? context_.environment->local_rank() : 0;
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(context_.gpu_ids.at(static_cast<size_t>(local))));
}

std::shared_ptr<distributed::DistributedDataParallelBase> DDPStrategy::configure_ddp(
    const std::shared_ptr<torch::nn::Module>& module, const std::vector<int>& device_ids) {
  check_on_device(*module, device_ids);
  return std::make_shared<distributed::DistributedDataParallelBase>(module, process_group(), ddp_options_);
}

void DDPStrategy::check_on_device(const torch::nn::Module& module, const std::vector<int>& device_ids) {
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

void DDPStrategy::convert_sync_batchnorm(const std::shared_ptr<torch::nn::Module>& module) {
  if (!context_.sync_batchnorm) return;
  distributed::convert_sync_batchnorm(module, process_group());
  const auto held = distributed::detail::replaced_batchnorms_still_held(*module);
  if (held.empty()) return;
  std::string names;
  for (const auto& n : held) names += (names.empty() ? "'" : ", '") + n + "'";
  throw UsageError("--sync-batchnorm true cannot convert the BatchNorm layer(s) " + names +
                   ": the model also holds them in typed members (such as `torch::nn::BatchNorm2d bn;`), which "
                   "keep calling the original layer, so their statistics would not be synchronised. Declare those "
                   "members as lockstep::distributed::SyncBatchNorm (plain BatchNorm on one process), or run "
                   "without --sync-batchnorm.");
}

std::shared_ptr<WrappedModule> DDPStrategy::setup_module(const std::shared_ptr<torch::nn::Module>& module) {
  convert_sync_batchnorm(module);
  std::vector<int> device_ids;
  if (context_.accelerator == accelerators::Accelerator::cuda) device_ids.push_back(root_device().index());
  ddp_ = configure_ddp(module, device_ids);
  return std::make_shared<DDPModule>(ddp_);
}

void DDPStrategy::teardown() { ddp_.reset(); }

torch::Tensor DDPStrategy::training_step(TrainingModule& module, Batch& batch, int64_t batch_idx) {
  // Before the forward, also with manual optimisation: backward may need the broadcast buffers
  // unchanged (batch norm saves them).
  ddp_->prepare_forward();
  if (!module.automatic_optimization()) {
    // The step calls the module's parts itself, unseen: a plain loss.backward() reduces too.
    ddp_->sync_every_backward();
    return module.training_step(batch, batch_idx);
  }
  torch::Tensor loss = module.training_step(batch, batch_idx);
  if (loss.defined()) ddp_->finish_forward(loss);
  return loss;
}

void DDPStrategy::manual_backward(const torch::Tensor& loss) {
  // A manual step computes its outputs outside the wrapper; arm the reduction from the loss.
  ddp_->finish_forward(loss);
  try {
    loss.backward();
  } catch (const distributed::UnusedParametersError& e) {
    // The usual cause here: parts of the model trained in alternation (a GAN).
    throw distributed::UnusedParametersError(
        message_of(e) + " If parts of the model are updated in alternation (a GAN's generator and "
                                "discriminator), use --strategy ddp_separate: one DistributedDataParallel per "
                                "child module.",
        e.parameter_names());
  }
}

void DDPStrategy::set_gradient_sync(bool enabled) {
  if (ddp_) ddp_->set_require_backward_grad_sync(enabled);
}

int DDPStrategy::world_size() const { return group_ ? group_->world_size() : context_.environment->world_size(); }
int DDPStrategy::global_rank() const { return group_ ? group_->rank() : context_.environment->global_rank(); }
int DDPStrategy::local_rank() const { return context_.environment->local_rank(); }
int DDPStrategy::node_rank() const { return context_.environment->node_rank(); }

torch::Tensor DDPStrategy::all_reduce(torch::Tensor tensor, distributed::ReduceOp op) {
  return distributed::all_reduce(process_group(), tensor, op);
}

std::vector<torch::Tensor> DDPStrategy::all_gather(const torch::Tensor& tensor) {
  return distributed::all_gather(process_group(), tensor);
}

void DDPStrategy::barrier(const std::string& name) { distributed::barrier(process_group(), name); }

c10::IValue DDPStrategy::broadcast(const c10::IValue& value, int src) {
  return distributed::broadcast(process_group(), value, src);
}

bool DDPStrategy::reduce_boolean_decision(bool decision, distributed::Decision rule) {
  return distributed::reduce_boolean_decision(process_group(), decision, rule);
}

std::optional<std::pair<int, int>> DDPStrategy::distributed_sampler_kwargs() const {
  return std::make_pair(world_size(), global_rank());
}

}  // namespace strategies
}  // namespace lockstep
