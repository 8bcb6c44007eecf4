#pragma once
/// SeparateDDP: one DistributedDataParallel per child module, for models whose parts are updated
/// in alternation (a GAN's generator and discriminator). The C++ counterpart of MMEditing's
/// DistributedDataParallelWrapper.

#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/util/Type.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <lockstep/core/error.h>
#include <lockstep/distributed/ddp/ddp.h>
#include <lockstep/distributed/wrapped_parameters.h>

namespace lockstep {
namespace distributed {

namespace detail {

template <typename T>
using is_tensor_input = std::disjunction<std::is_same<std::decay_t<T>, at::Tensor>,
                                         std::is_same<std::decay_t<T>, std::vector<at::Tensor>>>;

/// Tensors (and vectors of them) moved to `device`; anything else passed through unchanged.
template <typename T, std::enable_if_t<!is_tensor_input<T>::value, int> = 0>
T&& to_device(T&& value, const c10::Device&) {
  return std::forward<T>(value);
}
inline at::Tensor to_device(const at::Tensor& tensor, const c10::Device& device) {
  return tensor.defined() ? tensor.to(device) : tensor;
}
inline std::vector<at::Tensor> to_device(const std::vector<at::Tensor>& tensors, const c10::Device& device) {
  std::vector<at::Tensor> out;
  out.reserve(tensors.size());
  for (const auto& t : tensors) out.push_back(to_device(t, device));
  return out;
}

}  // namespace detail

/// SeparateDDP's defaults: DDPOptions' own, but without broadcast_buffers, as MMEditing's
/// DistributedDataParallelWrapper (the per-submodule wrapper SeparateDDP follows) defaults to:
/// each rank keeps its own BatchNorm running statistics. SeparateDDP takes an unset
/// broadcast_buffers as false too, so `DDPOptions().bucket_cap_mb(50)` keeps this default;
/// `.broadcast_buffers(true)` broadcasts rank 0's before each training forward.
inline DDPOptions separate_ddp_options() { return DDPOptions().broadcast_buffers(false); }

/// One child of a SeparateDDP, typed: forward() moves tensor arguments to the process's device
/// and runs the child's own forward through its DistributedDataParallel (or directly, for a
/// child without parameters, which has none).
template <typename ModuleType>
class SeparateDDPChild {
 public:
  SeparateDDPChild(std::shared_ptr<ModuleType> module, DistributedDataParallelBase* ddp, c10::Device device)
      : module_(std::move(module)), ddp_(ddp), device_(device) {}

  template <typename... Args>
  auto forward(Args&&... args)
      -> decltype(std::declval<ModuleType&>().forward(detail::to_device(std::forward<Args>(args), c10::Device(c10::kCPU))...)) {
    if (ddp_) ddp_->prepare_forward();
    auto outputs = module_->forward(detail::to_device(std::forward<Args>(args), device_)...);
    if (ddp_) ddp_->finish_forward(outputs);
    return outputs;
  }
  template <typename... Args>
  auto operator()(Args&&... args) -> decltype(this->forward(std::forward<Args>(args)...)) {
    return forward(std::forward<Args>(args)...);
  }

  /// The child module itself.
  const std::shared_ptr<ModuleType>& module() const { return module_; }
  ModuleType* operator->() const { return module_.get(); }
  /// Its DistributedDataParallel; nullptr for a child without parameters.
  DistributedDataParallelBase* ddp() const { return ddp_; }

 private:
  std::shared_ptr<ModuleType> module_;
  DistributedDataParallelBase* ddp_;
  c10::Device device_;
};

/// Wraps each direct child of `module` that has parameters in its own DistributedDataParallel
/// (in registration order, the same on every rank); children without parameters are only moved
/// to the device. Each part then reduces its own gradients in its own backward passes, so a
/// discriminator step that leaves the generator without gradients is fine — unlike one DDP
/// around the whole model, which fails there (its generator parameters got no gradient):
///
///   Gan gan;  // children "generator", "discriminator"
///   SeparateDDP sep(gan, *group);
///   auto G = sep.module<GeneratorImpl>("generator");
///   auto D = sep.module<DiscriminatorImpl>("discriminator");
///   auto fake = G(z).detach();                                      // discriminator step
///   (bce(D(real), ones) + bce(D(fake), zeros)).backward(); opt_d.step();
///   bce(D(G(z)), ones).backward(); opt_g.step();                    // generator step
///
/// One device per process (`device_ids` holds at most one; empty: the device of the module's
/// parameters, else CPU). Parameters registered on the root itself would belong to no DDP, and
/// are an error. Defaults: separate_ddp_options() (applied to every child; buffers are not
/// broadcast unless `options` sets broadcast_buffers(true)).
class SeparateDDP {
 public:
  SeparateDDP(std::shared_ptr<torch::nn::Module> module, ProcessGroup& group,
              DDPOptions options = separate_ddp_options(), std::vector<c10::Device> device_ids = {});
  template <typename ModuleType>
  SeparateDDP(const torch::nn::ModuleHolder<ModuleType>& module, ProcessGroup& group,
              DDPOptions options = separate_ddp_options(), std::vector<c10::Device> device_ids = {})
      : SeparateDDP(module.ptr(), group, std::move(options), std::move(device_ids)) {}

  /// Child `name` as a forward callable of its own type (the Impl class); throws
  /// UsageError if there is no such child or it is not a `ModuleType`.
  template <typename ModuleType>
  SeparateDDPChild<ModuleType> module(const std::string& name) const {
    auto child = std::dynamic_pointer_cast<ModuleType>(child_module(name));
    if (!child) {
      throw UsageError("SeparateDDP: child '" + name + "' is a " + child_module(name)->name() +
                                  ", not a " + c10::demangle_type<ModuleType>() + ".");
    }
    return SeparateDDPChild<ModuleType>(std::move(child), find_ddp(name), device_);
  }
  /// The DistributedDataParallel of child `name` (for no_sync(), join(), traces); throws
  /// UsageError for a child without parameters, which has none.
  DistributedDataParallelBase& ddp(const std::string& name) const;
  /// For code that calls the children directly (`gan->generator(z)`) rather than through
  /// module<Type>(), the two halves of what those calls do:
  ///   sep.prepare_forward();                  // once per step, before the forwards
  ///   auto d_loss = ...; sep.arm_for_backward(d_loss); d_loss.backward();
  ///   auto g_loss = ...; sep.arm_for_backward(g_loss); g_loss.backward();
  /// prepare_forward() refuses a parameter registered on the module after wrapping (a new child's
  /// too: UsageError naming it) and readies every wrapped child (buckets rebuilt once; buffers broadcast
  /// with broadcast_buffers(true)); arm_for_backward(loss) arms the DistributedDataParallel of
  /// each child whose parameters `loss` depends on, and only those, so that its backward reduces
  /// exactly their gradients.
  /// Every rank must make the same calls in the same order (they are collectives).
  void prepare_forward() const;
  void arm_for_backward(const at::Tensor& loss) const;
  /// arm_for_backward from several tensors (a forward's outputs).
  void arm_for_backward(const std::vector<at::Tensor>& outputs) const;
  /// For code whose forwards and losses are unseen: until the next prepare_forward(), every
  /// backward reduces the gradients of the children it reaches (see
  /// DistributedDataParallelBase::sync_every_backward).
  void sync_every_backward() const;
  /// Whether the next backward passes synchronise gradients (false: they accumulate locally, as
  /// under no_sync()), for every wrapped child.
  void set_require_backward_grad_sync(bool enabled) const;
  bool require_backward_grad_sync() const;

  /// Names of the children, in order, and whether each is wrapped.
  std::vector<std::string> children() const { return names_; }
  bool is_wrapped(const std::string& name) const { return find_ddp(name) != nullptr; }

  /// Tensors (and vectors of them) moved to the process's device.
  template <typename T>
  decltype(auto) to_device(T&& value) const {
    return detail::to_device(std::forward<T>(value), device_);
  }
  /// All parameters of the module (for one optimizer; usually each part has its own).
  std::vector<at::Tensor> parameters() const { return module_->parameters(); }
  const std::shared_ptr<torch::nn::Module>& base_module() const { return module_; }
  c10::Device device() const { return device_; }

 private:
  const std::shared_ptr<torch::nn::Module>& child_module(const std::string& name) const;
  DistributedDataParallelBase* find_ddp(const std::string& name) const;

  std::shared_ptr<torch::nn::Module> module_;
  c10::Device device_;
  std::vector<std::string> names_;
  std::map<std::string, std::shared_ptr<torch::nn::Module>> children_;
  std::map<std::string, std::unique_ptr<DistributedDataParallelBase>> ddps_;
  WrappedParameters wrapped_;  // refuses parameters registered after wrapping (a new child's too)
};

}  // namespace distributed
}  // namespace lockstep
