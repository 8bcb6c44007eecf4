#include <lockstep/distributed/ddp/ddp.h>

#include <map>
#include <sstream>
#include <stdexcept>
#include <unordered_set>

#include <torch/torch.h>

#include <lockstep/core/error.h>
#include <lockstep/distributed/collectives.h>
#include <lockstep/distributed/ddp/sync_batchnorm.h>
#include <lockstep/distributed/module_state.h>

namespace lockstep {
namespace distributed {

NoSyncGuard::NoSyncGuard(DistributedDataParallelBase& ddp) : ddp_(ddp), previous_(ddp.require_backward_grad_sync()) {
  ddp_.set_require_backward_grad_sync(false);
}

NoSyncGuard::~NoSyncGuard() { ddp_.set_require_backward_grad_sync(previous_); }

DistributedDataParallelBase::DistributedDataParallelBase(std::shared_ptr<torch::nn::Module> module, ProcessGroup& group,
                                                         DDPOptions options)
    : module_(std::move(module)), group_(group), options_(std::move(options)) {
  if (!module_) throw UsageError("DistributedDataParallel: the module is null.");
  if (!options_.broadcast_buffers()) options_.broadcast_buffers(true);  // PyTorch's default
  if (options_.bucket_cap_mb() <= 0 || options_.first_bucket_mb() <= 0) {
    throw UsageError("DDPOptions: bucket_cap_mb and first_bucket_mb must be positive (given " +
                                std::to_string(options_.bucket_cap_mb()) + " and " +
                                std::to_string(options_.first_bucket_mb()) + ").");
  }
  verify_same_parameters(*module_, group_, "DistributedDataParallel");
  // Shared parameters appear once.
  std::unordered_set<const void*> seen;
  std::vector<at::Tensor> all_params, reduced;
  std::vector<std::string> reduced_names;
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    if (!seen.insert(item.value().unsafeGetTensorImpl()).second) continue;
    all_params.push_back(item.value());
    if (!item.value().requires_grad()) continue;
    reduced.push_back(item.value());
    reduced_names.push_back(item.key());
  }
  for (const auto& buffer : module_->buffers(/*recurse=*/true)) {
    if (buffer.defined()) buffers_.push_back(buffer);
  }
  broadcast_tensors(group_, all_params, "DDP parameters");
  broadcast_tensors(group_, buffers_, "DDP buffers");
  all_params_ = std::move(all_params);
  wrapped_ = WrappedParameters(*module_, "DistributedDataParallel");
  for (const auto& m : module_->modules(/*include_self=*/true)) {
    auto* sync = dynamic_cast<SyncBatchNormImpl*>(m.get());
    has_converted_batchnorm_ = has_converted_batchnorm_ || (sync && sync->replaced_counter.defined());
  }
  auto transport = choose_gradient_transport(group_, reduced, options_.shared_memory(), &why_not_shared_memory_);
  reducer_ = std::make_unique<Reducer>(std::move(reduced), std::move(reduced_names), group_, options_,
                                       std::move(transport));
}

DistributedDataParallelBase::~DistributedDataParallelBase() = default;

void DistributedDataParallelBase::prepare_forward() {
  wrapped_.check(*module_);
  // Under a Join the collectives below are matched by join_main_hook on the joined ranks, in
  // this order: handshake, bucket rebuild, buffers, gradient-sync flag; then the backward's.
  const auto join = notify_join_context();
  const bool divide_by_active = join && !join_options()->divide_by_initial_world_size();
  reducer_->set_contributing_ranks(divide_by_active ? join->active_ranks : group_.world_size());
  reducer_->prepare_for_forward();
  // Only training forwards broadcast (PyTorch's), so one rank may evaluate alone; under a Join
  // every forward does, as the joined ranks' shadow does. Buffers come from the highest rank
  // still training: a joined rank's are stale (PyTorch).
  const bool training_forward = at::GradMode::is_enabled() && module_->is_training();
  if (*options_.broadcast_buffers() && (training_forward || join)) {
    broadcast_tensors(group_, buffers_, "DDP buffers", join ? join->last_active_rank : 0);
  }
  if (join) share_grad_sync(require_backward_grad_sync_ && at::GradMode::is_enabled());
}

bool DistributedDataParallelBase::share_grad_sync(bool sync) {
  auto flag = torch::tensor({sync ? 1 : 0}, torch::kInt32);
  all_reduce(group_, flag, ReduceOp::sum, CollectiveOptions().tag("Join gradient-sync flag"));
  return flag.item<int32_t>() > 0;
}

void DistributedDataParallelBase::join_main_hook(const JoinState& state) {
  reducer_->prepare_for_forward();
  if (*options_.broadcast_buffers()) broadcast_tensors(group_, buffers_, "DDP buffers", state.last_active_rank);
  if (share_grad_sync(false)) reducer_->join_backward();
}

void DistributedDataParallelBase::join_post_hook(bool is_last_joiner) {
  auto source = torch::tensor({is_last_joiner ? group_.rank() : -1}, torch::kInt32);
  all_reduce(group_, source, ReduceOp::max, CollectiveOptions().tag("Join final model source"));
  const int src = source.item<int32_t>();
  broadcast_tensors(group_, all_params_, "DDP parameters", src);
  broadcast_tensors(group_, buffers_, "DDP buffers", src);
}

void DistributedDataParallelBase::finish_forward_tensors(const std::vector<at::Tensor>& outputs, bool outputs_known) {
  if (has_converted_batchnorm_ && module_->is_training()) detail::check_replaced_batchnorms_unused(*module_);
  reducer_->prepare_for_backward(outputs, require_backward_grad_sync_, outputs_known);
}

void DistributedDataParallelBase::sync_every_backward() {
  reducer_->sync_every_backward(require_backward_grad_sync_);
}

}  // namespace distributed
}  // namespace lockstep
