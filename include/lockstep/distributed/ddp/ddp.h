#pragma once
/// DistributedDataParallel: data-parallel training of a LibTorch module over a ProcessGroup, as
/// torch.nn.parallel.DistributedDataParallel does in Python.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <lockstep/distributed/ddp/ddp_options.h>
#include <lockstep/distributed/ddp/join.h>
#include <lockstep/distributed/ddp/output_tensors.h>
#include <lockstep/distributed/ddp/reducer.h>
#include <lockstep/distributed/process_group.h>
#include <lockstep/distributed/wrapped_parameters.h>

namespace lockstep {
namespace distributed {

class DistributedDataParallelBase;

/// While alive, backward passes accumulate gradients locally without communication; the first
/// synchronised backward after it reduces the accumulated sum (gradient accumulation).
class NoSyncGuard {
 public:
  explicit NoSyncGuard(DistributedDataParallelBase& ddp);
  ~NoSyncGuard();
  NoSyncGuard(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(const NoSyncGuard&) = delete;

 private:
  DistributedDataParallelBase& ddp_;
  bool previous_;
};

/// The module-type-independent part of DistributedDataParallel. A wrapper that runs forward
/// itself (a strategy, a module with a custom forward signature) calls prepare_forward() before
/// the module's forward and finish_forward(outputs) after it:
///
///   ddp.prepare_forward();
///   auto out = net->forward(x, y);
///   ddp.finish_forward(out);  // tensors, or vectors / tuples / maps / IValues of them
class DistributedDataParallelBase : public Joinable {
 public:
  /// Checks that every rank holds the same parameters (a collective; on mismatch every rank
  /// throws DistributedError naming the first differing parameter and the ranks), broadcasts
  /// rank 0's parameters and buffers, and hooks the parameters' gradients. `group` must outlive
  /// this object.
  DistributedDataParallelBase(std::shared_ptr<torch::nn::Module> module, ProcessGroup& group, DDPOptions options);
  virtual ~DistributedDataParallelBase();
  DistributedDataParallelBase(const DistributedDataParallelBase&) = delete;
  DistributedDataParallelBase& operator=(const DistributedDataParallelBase&) = delete;

  /// Before the module's forward: fails if the last backward did not finish its reduction; with
  /// grad mode on, rebuilds buckets once after the first step; in training forwards (grad mode
  /// on, module training) broadcasts rank 0's buffers (broadcast_buffers), as PyTorch does, so
  /// that evaluating on one rank alone under NoGradGuard runs no collective. Refuses (UsageError)
  /// a parameter registered on the module after it was wrapped, naming it.
  void prepare_forward();
  /// After the module's forward, with its outputs: arms the reduction of the next backward when
  /// grad mode is on (unless under no_sync(), which keeps it local), as PyTorch's forward does, so
  /// a plain `loss.backward()` averages the gradients; with find_unused_parameters, finds the
  /// parameters the outputs do not depend on.
  template <typename Outputs>
  void finish_forward(const Outputs& outputs);
  /// finish_forward with the tensors already collected; `outputs_known` false when they could not
  /// all be found in the forward's result (find_unused_parameters then finds unused parameters at
  /// the end of backward).
  void finish_forward_tensors(const std::vector<at::Tensor>& outputs, bool outputs_known);
  /// For code whose forwards the wrapper does not see (a manually optimised Trainer step calls
  /// the module's parts itself): until the next prepare_forward(), every backward reduces its
  /// gradients (none under no_sync()). With find_unused_parameters the unused parameters are then
  /// found at the end of each backward, so their buckets are reduced after it, not during it.
  void sync_every_backward();

  /// Gradient accumulation without communication while the guard lives:
  ///   { auto guard = ddp.no_sync(); ddp.forward(x1).sum().backward(); }
  ///   ddp.forward(x2).sum().backward();  // reduces the sum of both micro-steps
  NoSyncGuard no_sync() { return NoSyncGuard(*this); }
  /// Training with uneven inputs (PyTorch's `with model.join():`): while the returned Join
  /// lives, a rank that has run out of batches, on leaving its scope, shadows the other ranks'
  /// forward/backward collectives with zero gradients until all are done; then every rank takes
  /// the parameters and buffers of a rank that finished last. Gradients are averaged over the
  /// initial world size unless JoinOptions().divide_by_initial_world_size(false).
  ///   { auto join = ddp.join(); for (auto& b : my_batches) { ...forward, backward, step... } }
  Join join(JoinOptions options = {}) { return Join({this}, std::move(options)); }

  /// False under no_sync().
  bool require_backward_grad_sync() const { return require_backward_grad_sync_; }
  void set_require_backward_grad_sync(bool sync) { require_backward_grad_sync_ = sync; }

  /// The wrapped module, type-erased.
  const std::shared_ptr<torch::nn::Module>& base_module() const { return module_; }
  /// The module's parameters (for the optimizer).
  std::vector<at::Tensor> parameters() const { return module_->parameters(); }
  ProcessGroup& group() const { return group_; }
  /// The options in effect: an unset broadcast_buffers reads as the value used (true here).
  const DDPOptions& options() const { return options_; }
  Reducer& reducer() { return *reducer_; }
  /// Why the buckets are not averaged through shared memory, e.g. "turned off in DDPOptions
  /// (ranks 0, 1)"; "" when they are.
  const std::string& why_not_shared_memory() const { return why_not_shared_memory_; }
  /// Timeline of the last synchronised backward: bucket ready / launched / reduced times.
  const ReducerTrace& last_trace() const { return reducer_->last_trace(); }

  /// Joinable: one iteration's collectives with zero gradients (rebuilt buckets, buffers, the
  /// gradient sync, the map of used parameters), on a rank that has run out of inputs.
  void join_main_hook(const JoinState& state) override;
  /// Joinable: copies the parameters and buffers of the highest rank among the last joiners.
  void join_post_hook(bool is_last_joiner) override;
  ProcessGroup& join_process_group() override { return group_; }

 private:
  /// Under a Join: whether any active rank reduces gradients in this iteration's backward.
  bool share_grad_sync(bool sync);

  std::shared_ptr<torch::nn::Module> module_;
  ProcessGroup& group_;
  DDPOptions options_;
  std::vector<at::Tensor> all_params_;
  WrappedParameters wrapped_;  // refuses parameters registered after wrapping
  std::vector<at::Tensor> buffers_;
  std::string why_not_shared_memory_;
  std::unique_ptr<Reducer> reducer_;
  bool require_backward_grad_sync_ = true;
  bool has_converted_batchnorm_ = false;  // convert_sync_batchnorm ran on the module
};

/// Data-parallel training of a module of type `ModuleType` (the Impl class, e.g. `NetImpl`, or
/// torch::nn::Module when only prepare_forward/finish_forward are used). forward() runs the
/// module's own forward, with any arguments, and returns what it returns; backward and the
/// optimizer step stay as in single-process code:
///
///   auto net = std::make_shared<NetImpl>();          // or a TORCH_MODULE holder `Net net;`
///   DistributedDataParallel ddp(net, *group, DDPOptions().bucket_cap_mb(25));
///   torch::optim::SGD opt(ddp.parameters(), 0.1);
///   auto loss = torch::mse_loss(ddp.forward(x), y);  // or ddp(x)
///   opt.zero_grad();
///   loss.backward();                                 // gradients are averaged over the ranks here
///   opt.step();
///
/// Defaults: see DDPOptions. Every rank must construct it, and run the same synchronised
/// backward passes, in the same order.
template <typename ModuleType>
class DistributedDataParallel : public DistributedDataParallelBase {
 public:
  DistributedDataParallel(std::shared_ptr<ModuleType> module, ProcessGroup& group, DDPOptions options = {})
      : DistributedDataParallelBase(module, group, std::move(options)), typed_(std::move(module)) {}
  DistributedDataParallel(const torch::nn::ModuleHolder<ModuleType>& module, ProcessGroup& group,
                          DDPOptions options = {})
      : DistributedDataParallel(module.ptr(), group, std::move(options)) {}

  /// The module's forward, with gradient reduction armed for the next backward.
  template <typename... Args>
  auto forward(Args&&... args) -> decltype(std::declval<ModuleType&>().forward(std::forward<Args>(args)...)) {
    prepare_forward();
    auto outputs = typed_->forward(std::forward<Args>(args)...);
    finish_forward(outputs);
    return outputs;
  }
  template <typename... Args>
  auto operator()(Args&&... args) -> decltype(std::declval<ModuleType&>().forward(std::forward<Args>(args)...)) {
    return forward(std::forward<Args>(args)...);
  }

  /// The wrapped module.
  const std::shared_ptr<ModuleType>& module() const { return typed_; }

 private:
  std::shared_ptr<ModuleType> typed_;
};

template <typename ModuleType>
DistributedDataParallel(std::shared_ptr<ModuleType>, ProcessGroup&, DDPOptions = {})
    -> DistributedDataParallel<ModuleType>;
template <typename ModuleType>
DistributedDataParallel(torch::nn::ModuleHolder<ModuleType>, ProcessGroup&, DDPOptions = {})
    -> DistributedDataParallel<ModuleType>;

/// DistributedDataParallel on the heap, its module type deduced:
///   auto ddp = make_ddp(net, *group);  auto out = ddp->forward(x);
template <typename ModuleType>
std::shared_ptr<DistributedDataParallel<ModuleType>> make_ddp(std::shared_ptr<ModuleType> module, ProcessGroup& group,
                                                              DDPOptions options = {}) {
  return std::make_shared<DistributedDataParallel<ModuleType>>(std::move(module), group, std::move(options));
}
template <typename ModuleType>
std::shared_ptr<DistributedDataParallel<ModuleType>> make_ddp(const torch::nn::ModuleHolder<ModuleType>& module,
                                                              ProcessGroup& group, DDPOptions options = {}) {
  return make_ddp(module.ptr(), group, std::move(options));
}

template <typename Outputs>
void DistributedDataParallelBase::finish_forward(const Outputs& outputs) {
  std::vector<at::Tensor> tensors;
  const bool known = output_tensors(outputs, tensors);
  finish_forward_tensors(tensors, known);
}

}  // namespace distributed
}  // namespace lockstep
