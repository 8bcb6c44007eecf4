#include <lockstep/distributed/ddp/separate_ddp.h>

#include <sstream>

#include <torch/cuda.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <lockstep/core/error.h>
#include <lockstep/distributed/ddp/reducer.h>

namespace lockstep {
namespace distributed {
namespace {

std::string list(const std::vector<c10::Device>& devices) {
  std::ostringstream out;
  for (size_t k = 0; k < devices.size(); ++k) out << (k ? ", " : "") << devices[k];
  return out.str();
}

c10::Device choose_device(const torch::nn::Module& module, const std::vector<c10::Device>& device_ids) {
  if (device_ids.size() > 1) {
    throw UsageError(
        "SeparateDDP supports one device per process, but got " + std::to_string(device_ids.size()) +
        " device_ids (" + list(device_ids) + "). Start one process per device (e.g. --devices " +
        std::to_string(device_ids.size()) + " with the ddp strategy) and give each its own device.");
  }
  if (device_ids.empty()) {
    const auto params = module.parameters();
    return params.empty() ? c10::Device(c10::kCPU) : params.front().device();
  }
  const auto device = device_ids.front();
  if (device.is_cuda() && !torch::cuda::is_available()) {
    throw UsageError("SeparateDDP: device " + device.str() +
                                " was asked for, but this LibTorch sees no CUDA device. Use the CPU (device_ids "
                                "{torch::kCPU} or empty).");
  }
  return device;
}

bool depends_on_any(const std::unordered_set<const torch::autograd::Node*>& reached, const torch::nn::Module& module) {
  for (const auto& p : module.parameters()) {
    if (!p.requires_grad()) continue;
    const auto accumulator = torch::autograd::impl::try_get_grad_accumulator(p);
    if (accumulator && reached.count(accumulator.get())) return true;
  }
  return false;
}

}  // namespace

SeparateDDP::SeparateDDP(std::shared_ptr<torch::nn::Module> module, ProcessGroup& group, DDPOptions options,
                         std::vector<c10::Device> device_ids)
    : module_(std::move(module)), device_(c10::kCPU) {
  if (!module_) throw UsageError("SeparateDDP: the module is null.");
  device_ = choose_device(*module_, device_ids);
  if (!options.broadcast_buffers()) options.broadcast_buffers(false);  // MMEditing's default
  const auto own = module_->named_parameters(/*recurse=*/false);
  if (!own.is_empty()) {
    throw UsageError("SeparateDDP wraps each child module in its own DistributedDataParallel, but the "
                                "root module has parameters of its own ('" + own.begin()->key() +
                                "'), which no wrapper would synchronise. Move them into a child module.");
  }
  module_->to(device_);
  for (const auto& child : module_->named_children()) {
    names_.push_back(child.key());
    children_[child.key()] = child.value();
    if (child.value()->parameters().empty()) continue;  // moved only
    ddps_[child.key()] = std::make_unique<DistributedDataParallelBase>(child.value(), group, options);
  }
  for (const auto& p : module_->parameters()) {
    if (p.device() != device_) {
      throw UsageError("SeparateDDP: after moving the module to " + device_.str() +
                                  ", a parameter is still on " + p.device().str() + "; one device per process.");
    }
  }
  wrapped_ = WrappedParameters(*module_, "SeparateDDP");
}

const std::shared_ptr<torch::nn::Module>& SeparateDDP::child_module(const std::string& name) const {
  auto it = children_.find(name);
  if (it != children_.end()) return it->second;
  std::string known;
  for (const auto& n : names_) known += (known.empty() ? "" : ", ") + n;
  throw UsageError("SeparateDDP: the module has no child '" + name + "'; its children are: " + known + ".");
}

DistributedDataParallelBase* SeparateDDP::find_ddp(const std::string& name) const {
  child_module(name);  // throws for an unknown name
  auto it = ddps_.find(name);
  return it == ddps_.end() ? nullptr : it->second.get();
}

void SeparateDDP::arm_for_backward(const at::Tensor& loss) const { arm_for_backward(std::vector<at::Tensor>{loss}); }

void SeparateDDP::arm_for_backward(const std::vector<at::Tensor>& outputs) const {
  const auto reached = autograd_nodes_reached_by(outputs);
  for (const auto& name : names_) {
    auto it = ddps_.find(name);
    if (it != ddps_.end() && depends_on_any(reached, *children_.at(name))) it->second->finish_forward(outputs);
  }
}

void SeparateDDP::sync_every_backward() const {
  for (const auto& entry : ddps_) entry.second->sync_every_backward();
}

bool SeparateDDP::require_backward_grad_sync() const {
  return ddps_.empty() || ddps_.begin()->second->require_backward_grad_sync();
}

void SeparateDDP::prepare_forward() const {
  wrapped_.check(*module_);
  for (const auto& name : names_) {
    auto it = ddps_.find(name);
    if (it != ddps_.end()) it->second->prepare_forward();
  }
}

void SeparateDDP::set_require_backward_grad_sync(bool enabled) const {
  for (const auto& entry : ddps_) entry.second->set_require_backward_grad_sync(enabled);
}

DistributedDataParallelBase& SeparateDDP::ddp(const std::string& name) const {
  auto* wrapped = find_ddp(name);
  if (!wrapped) {
    throw UsageError("SeparateDDP: child '" + name +
                                "' has no parameters, so it is not wrapped in a DistributedDataParallel (it was only "
                                "moved to the device). Call it through module<Type>(\"" + name + "\").");
  }
  return *wrapped;
}

}  // namespace distributed
}  // namespace lockstep
