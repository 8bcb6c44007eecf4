#include <lockstep/strategies/strategy.h>

#include <torch/nn/utils/clip_grad.h>

#include <lockstep/checkpoint/dcp_checkpoint.h>
#include <lockstep/checkpoint/optimizer_state.h>
#include <lockstep/checkpoint/sharded_checkpoint.h>
#include <lockstep/checkpoint/state_dict.h>
#include <lockstep/core/error.h>
#include <lockstep/core/training_module.h>
#include <lockstep/data/data_loader.h>
#include <lockstep/data/sampler.h>

namespace lockstep {
namespace strategies {

void Strategy::save_checkpoint(const checkpoint::Checkpoint& state, const std::string& path,
                               const checkpoint::CheckpointIO& io,
                               const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers) {
  if (is_global_zero()) io.save(state, path);
}

checkpoint::Checkpoint Strategy::load_checkpoint(const std::string& path, const checkpoint::CheckpointIO& io,
                                                 const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers) {
  // A sharded directory (from --strategy fsdp) loads whole here: one process and DDP resume from it.
  if (checkpoint::is_sharded_checkpoint(path)) return checkpoint::to_full_checkpoint(checkpoint::load_sharded(path));
  if (checkpoint::is_dcp_checkpoint(path)) return checkpoint::to_full_checkpoint(checkpoint::load_dcp(path));
  return io.load(path);
}

torch::Tensor Strategy::training_step(TrainingModule& module, Batch& batch, int64_t batch_idx) {
  return module.training_step(batch, batch_idx);
}

double Strategy::clip_grad_norm(const std::vector<torch::Tensor>& parameters, double max_norm, double norm_type) {
  return torch::nn::utils::clip_grad_norm_(parameters, max_norm, norm_type);
}

double Strategy::gradient_norm(const std::vector<torch::Tensor>& parameters, double norm_type) {
  std::vector<torch::Tensor> norms;
  for (const auto& p : parameters) {
    if (p.grad().defined()) norms.push_back(p.grad().detach().norm(norm_type).to(torch::kFloat64).cpu());
  }
  return norms.empty() ? 0.0 : torch::stack(norms).norm(norm_type).item<double>();
}

c10::Dict<std::string, torch::Tensor> Strategy::module_state_dict(const torch::nn::Module& module) {
  return checkpoint::state_dict(module);
}

void Strategy::load_module_state_dict(torch::nn::Module& module, const c10::impl::GenericDict& state, bool strict) {
  checkpoint::load_state_dict(module, state, strict);
}

std::vector<std::pair<std::string, torch::Tensor>> Strategy::local_weights(const torch::nn::Module& module) {
  std::vector<std::pair<std::string, torch::Tensor>> weights;
  for (const auto& item : module.named_parameters()) weights.emplace_back(item.key(), item.value().detach());
  for (const auto& item : module.named_buffers()) {
    if (item.value().defined()) weights.emplace_back(item.key(), item.value().detach());
  }
  return weights;
}

void Strategy::load_local_weights(torch::nn::Module& module, const std::map<std::string, torch::Tensor>& values) {
  torch::NoGradGuard no_grad;
  const auto copy = [&](const std::string& name, const torch::Tensor& tensor) {
    const auto found = values.find(name);
    if (found == values.end() || !tensor.defined()) return;
    LOCKSTEP_CHECK(found->second.numel() == tensor.numel(), UsageError, "load_local_weights: '", name, "' has ",
                   found->second.numel(), " elements in the values and ", tensor.numel(), " in the module.");
    tensor.copy_(found->second.view_as(tensor));
  };
  for (const auto& item : module.named_parameters()) copy(item.key(), item.value());
  for (const auto& item : module.named_buffers()) copy(item.key(), item.value());
}

c10::impl::GenericDict Strategy::optimizer_state_dict(const torch::optim::Optimizer& optimizer) {
  return checkpoint::optimizer_state_dict(optimizer);
}

void Strategy::load_optimizer_state_dict(torch::optim::Optimizer& optimizer, const c10::impl::GenericDict& state) {
  checkpoint::load_optimizer_state_dict(optimizer, state);
}

bool add_distributed_sampler(const Strategy& strategy, DataLoader& loader, bool shuffle, bool unrepeated) {
  const auto kwargs = strategy.distributed_sampler_kwargs();
  if (!kwargs || loader.has_sampler()) return false;
  loader.set_sampler(std::make_shared<distributed::DistributedSampler>(
      loader.dataset()->size(), distributed::SamplerOptions(kwargs->first, kwargs->second)
                                    .shuffle(shuffle)
                                    .seed(loader.seed())
                                    .drop_last(false)
                                    .unrepeated(unrepeated)));
  return true;
}

torch::Device SingleDeviceStrategy::root_device() const {
  if (context_.accelerator == accelerators::Accelerator::cuda) {
    return torch::Device(torch::kCUDA, context_.gpu_ids.empty() ? 0 : static_cast<c10::DeviceIndex>(context_.gpu_ids[0]));
  }
  return torch::Device(torch::kCPU);
}

}  // namespace strategies
}  // namespace lockstep
