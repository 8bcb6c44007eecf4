#include "sharded_unit.h"

#include <chrono>

#include <c10/core/StorageImpl.h>
#include <torch/torch.h>

#include <lockstep/core/heap.h>
#include <lockstep/distributed/collectives.h>

namespace lockstep {
namespace distributed {
namespace detail {
namespace {

// `sizes` elements of `buffer` from `offset` on, sharing its storage but not an autograd view of
// it: optimizers may detach_() and zero_() it, and it follows the storage when that is freed and
// allocated again.
at::Tensor alias(const at::Tensor& buffer, int64_t offset, at::IntArrayRef sizes) {
  torch::NoGradGuard no_grad;
  auto slice = at::empty({0}, buffer.options());
  slice.set_(buffer.storage(), buffer.storage_offset() + offset, sizes);
  return slice;
}

bool is_alias_of(const at::Tensor& tensor, const at::Tensor& of) {
  return tensor.defined() && tensor.storage().unsafeGetStorageImpl() == of.storage().unsafeGetStorageImpl() &&
         tensor.storage_offset() == of.storage_offset() && tensor.sizes() == of.sizes();
}

// Resharding gives a unit's whole parameters' storage zero bytes, and gathers into the same
// storage again, so that the tensors that forward saved for backward see the gathered values
// (PyTorch's FSDP does the same). On the CPU, given a pool, the memory waits there for the next
// gather instead of going back to the system.
void release_storage(const at::Tensor& tensor, GatherPool* pool) {
  auto* storage = tensor.storage().unsafeGetStorageImpl();
  const size_t bytes = storage->nbytes();
  auto data = storage->set_data_ptr(at::DataPtr(nullptr, tensor.device()));
  storage->set_nbytes(0);
  if (pool && tensor.device().is_cpu()) pool->give(std::move(data), bytes);
}

size_t storage_bytes(const at::Tensor& tensor) { return static_cast<size_t>(tensor.numel()) * tensor.element_size(); }

// Gives `tensor`'s storage its memory back: `handed_over`, or fresh memory where that is empty.
// Returns the bytes allocated afresh.
int64_t allocate_storage(const at::Tensor& tensor, at::DataPtr handed_over) {
  auto* storage = tensor.storage().unsafeGetStorageImpl();
  const size_t bytes = storage_bytes(tensor);
  if (storage->nbytes() == bytes) return 0;
  auto data = std::move(handed_over);
  const bool fresh = !data;
  if (fresh) data = storage->allocator()->allocate(bytes);
  storage->set_data_ptr_noswap(std::move(data));
  storage->set_nbytes(bytes);
  // A unit gathered into fresh memory: in 2 MiB pages its first touch faults 512 times less often.
  if (fresh && tensor.device().is_cpu()) core::ask_for_huge_pages(storage->data(), bytes);
  return fresh ? static_cast<int64_t>(bytes) : 0;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// An all-reduce (sum) of `tensor` in place across the HYBRID_SHARD replicas; bfloat16 goes as
// float32 (Gloo has no bfloat16 in LibTorch 1.13).
void all_reduce_across_replicas(ProcessGroup& replicas, at::Tensor& tensor, const std::string& what) {
  const auto options = CollectiveOptions().tag("FSDP all_reduce across replicas of " + what);
  if (tensor.scalar_type() != at::kBFloat16) {
    all_reduce(replicas, tensor, ReduceOp::sum, options);
    return;
  }
  auto wide = tensor.to(at::kFloat);
  all_reduce(replicas, wide, ReduceOp::sum, options);
  tensor.copy_(wide);
}

}  // namespace

ShardedUnit::ShardedUnit(std::string name, const std::vector<std::pair<std::string, at::Tensor>>& members, bool child,
                         const ShardingOptions& options, const ShardingPlan& plan, size_t first_index, CommContext& comm,
                         const std::function<void(size_t)>& before, const std::function<void(size_t)>& after)
    : name_(std::move(name)),
      plan_(plan),
      reduce_dtype_(options.reduce_dtype()),
      comm_(comm),
      rank_(comm.shard_group.rank()),
      first_index_(first_index) {
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> tensors;
  for (const auto& member : members) tensors.push_back(member.second);
  layout_ = FlatLayout::of(tensors, comm.shard_group.world_size());
  const auto dtype = tensors.empty() ? at::TensorOptions(at::kFloat) : tensors.front().options();
  auto flat = at::zeros({layout_.padded_numel()}, dtype);
  for (size_t k = 0; k < tensors.size(); ++k) {
    flat.narrow(0, layout_.offsets[k], layout_.numels[k]).copy_(tensors[k].reshape({-1}));
  }
  // A child unit with a param_dtype is gathered in it; its shard keeps the parameters' dtype.
  const auto param_dtype = options.param_dtype();
  const bool low = child && param_dtype && *param_dtype != dtype.dtype().toScalarType();
  full_ = low ? flat.to(*param_dtype) : flat;
  const int64_t mine = rank_ * layout_.shard_numel;
  shard_ = plan_.reshard_after_use || low ? flat.narrow(0, mine, layout_.shard_numel).clone()
                                          : alias(full_, mine, {layout_.shard_numel});
  reduced_ = at::zeros({plan_.whole_gradients ? layout_.padded_numel() : layout_.shard_numel}, dtype);
  for (size_t k = 0; k < tensors.size(); ++k) {
    ShardedParameter p;
    p.name = members[k].first;
    p.param = members[k].second;
    const auto piece = layout_.piece(k, rank_);
    p.whole = alias(full_, layout_.offsets[k], p.param.sizes());
    p.piece = alias(shard_, piece.shard_offset, {piece.numel});
    p.kept_grad = !plan_.sharded ? alias(reduced_, layout_.offsets[k], p.param.sizes())
                                 : alias(reduced_, (plan_.whole_gradients ? mine : 0) + piece.shard_offset, {piece.numel});
    hooks_.add(p.param, [before, k] { before(k); }, [after, k] { after(k); });
    p.param.set_data(p.whole);
    p.param.mutable_grad() = at::Tensor();
    params_.push_back(std::move(p));
  }
  reshard();
}

void ShardedUnit::unshard() {
  if (state_ != State::sharded) return;
  // Memory a unit handed over is taken here, in the training thread's order; fresh memory is
  // allocated on the communication thread, in queue order: after the reductions queued before
  // the gather have freed theirs.
  const auto handed_over = std::make_shared<at::DataPtr>(
      full_.device().is_cpu() && full_.storage().nbytes() == 0 ? comm_.gathered.take(storage_bytes(full_)) : at::DataPtr());
  gathering_ = comm_.thread->submit([this, handed_over] {
    const auto start = std::chrono::steady_clock::now();
    const int64_t fresh = allocate_storage(full_, std::move(*handed_over));
    // In the unit's compute dtype (param_dtype): half the bytes with bfloat16.
    const auto shard = shard_.scalar_type() == full_.scalar_type() ? shard_ : shard_.to(full_.scalar_type());
    comm_.transport->all_gather(shard, full_, "all_gather of unit '" + name_ + "''s parameters");
    const double seconds = seconds_since(start);
    comm_.record([seconds, fresh](auto& times) {
      times.all_gathers += 1;
      times.all_gather_s += seconds;
      times.all_gather_fresh_bytes += fresh;
    });
  });
  state_ = State::unsharding;
}

void ShardedUnit::wait_for_gather() {
  if (state_ != State::unsharding) return;
  const auto start = std::chrono::steady_clock::now();
  const auto ticket = std::move(gathering_);
  gathering_ = {};
  comm_.wait(ticket, "the all_gather of unit '" + name_ + "''s parameters");
  state_ = State::unsharded;
  const double seconds = seconds_since(start);
  comm_.record([seconds](auto& times) { times.all_gather_waited_s += seconds; });
}

void ShardedUnit::wait_for_unshard() {
  unshard();
  wait_for_gather();
  if (!parameters_whole_) point_parameters_at(true);
}

void ShardedUnit::reshard(bool hand_over) {
  if (!plan_.sharded) return;
  if (parameters_whole_) point_parameters_at(false);
  if (plan_.reshard_after_use && state_ != State::sharded) {
    wait_for_gather();  // a prefetch not used: let it land first
    release_storage(full_, hand_over ? &comm_.gathered : nullptr);
    state_ = State::sharded;
  }
}

void ShardedUnit::drained() {
  if (state_ != State::unsharding) return;
  gathering_ = {};
  state_ = State::unsharded;
}

void ShardedUnit::mark_stale() {
  if (plan_.sharded) state_ = State::sharded;
}

void ShardedUnit::point_parameters_at(bool whole) {
  for (size_t k = 0; k < params_.size(); ++k) {
    auto& p = params_[k];
    const auto& value = whole ? p.whole : p.piece;
    const bool retyped = p.param.scalar_type() != value.scalar_type();
    p.param.set_data(value);
    // Our accumulator (with its hooks, and the shape and dtype gradients are cast to) goes back.
    if (retyped) hooks_.reattach(k, p.param);
  }
  parameters_whole_ = whole;
}

void ShardedUnit::pre_backward() {
  torch::NoGradGuard no_grad;
  if (plan_.sharded && plan_.whole_gradients) {
    // ZeRO-1: only this rank's part of the whole gradients is kept from one backward to the next.
    const int64_t mine = rank_ * layout_.shard_numel;
    reduced_.narrow(0, 0, mine).zero_();
    reduced_.narrow(0, mine + layout_.shard_numel, reduced_.numel() - mine - layout_.shard_numel).zero_();
  }
  for (auto& p : params_) p.arrived = false;
  pending_ = params_.size();
}

void ShardedUnit::before_gradient(size_t k) {
  if (!params_[k].arrived) take_previous_gradient(k);
}

// The kept gradient as the optimizer left it (zeroed in place, set to none, or accumulating).
// Then autograd adds this backward's gradient in place into the unit's flat buffer (whole
// gradients), or, sharded, keeps it as the parameter's gradient without a copy: the
// reduce-scatter reads it there, and no flat buffer the unit's size is needed beside it.
void ShardedUnit::take_previous_gradient(size_t k) {
  torch::NoGradGuard no_grad;
  auto& p = params_[k];
  auto& grad = p.param.mutable_grad();
  p.had_grad = grad.defined();
  if (!grad.defined()) {
    p.kept_grad.zero_();
  } else if (!is_alias_of(grad, p.kept_grad)) {
    if (grad.numel() != p.kept_grad.numel()) {
      comm_.fail(comm_.group.describe() + ": FullyShardedDataParallel: parameter '" + p.name + "' has a gradient of " +
                 std::to_string(grad.numel()) + " elements where its shard has " +
                 std::to_string(p.kept_grad.numel()) + "; set gradients only through backward.");
    }
    p.kept_grad.copy_(grad.reshape(p.kept_grad.sizes()));
  }
  if (!plan_.whole_gradients) {
    grad = at::Tensor();
    return;
  }
  if (!flat_grad_.defined()) flat_grad_ = at::zeros({layout_.padded_numel()}, shard_.options());
  grad = alias(flat_grad_, layout_.offsets[k], layout_.shapes[k]);
}

bool ShardedUnit::gradient_arrived(size_t k) {
  auto& p = params_[k];
  if (p.arrived) {
    comm_.fail(comm_.group.describe() + ": FullyShardedDataParallel: parameter '" + p.name +
               "' received its gradient twice in one backward (a second backward through the same graph). Run "
               "one backward per forward.");
  }
  p.arrived = true;
  return --pending_ == 0;
}

void ShardedUnit::post_backward() {
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> grads;  // sharded: this backward's gradient of each parameter that got one
  std::vector<int64_t> offsets;
  for (size_t k = 0; k < params_.size(); ++k) {
    if (!params_[k].arrived) take_previous_gradient(k);  // no gradient in this backward: zero
    auto& grad = params_[k].param.mutable_grad();
    if (!plan_.whole_gradients && grad.defined()) {
      grads.push_back(grad.contiguous().view(-1));
      offsets.push_back(layout_.offsets[k]);
    }
    grad = at::Tensor();  // the whole gradient is in flat_grad_, or in `grads`
  }
  // The parameters are not needed again in this backward: free them before reducing.
  if (plan_.reshard_after_use) reshard();
  auto flat = std::move(flat_grad_);
  flat_grad_ = at::Tensor();
  if (plan_.whole_gradients && !flat.defined()) flat = at::zeros({layout_.padded_numel()}, shard_.options());
  comm_.thread->submit([this, flat = std::move(flat), grads = std::move(grads), offsets = std::move(offsets)]() mutable {
    torch::NoGradGuard no_grad;
    const auto start = std::chrono::steady_clock::now();
    const std::string what = "the gradients of unit '" + name_ + "'";
    const auto dtype = reduce_dtype_.value_or(shard_.scalar_type());
    const int world = comm_.group.world_size();
    if (flat.defined()) {
      if (flat.scalar_type() != dtype) flat = flat.to(dtype);
      // All-reduced as a reduce-scatter and an all-gather: summed in rank order, the bits of
      // DDP's and FULL_SHARD's sums (Gloo's all-reduce sums 3 or more ranks in another order).
      if (world > 1) {
        auto part = at::empty({layout_.shard_numel}, flat.options());
        comm_.transport->reduce_scatter(flat, part, world, "reduce_scatter of " + what);
        comm_.transport->all_gather(part, flat, "all_gather of " + what);
      }
      reduced_.add_(flat);
    } else {
      for (auto& grad : grads) {
        if (grad.scalar_type() != dtype) grad = grad.to(dtype);
      }
      FlatSegments pieces(layout_.padded_numel(), std::move(grads), std::move(offsets));
      if (!comm_.replica_group && reduced_.scalar_type() == dtype) {
        // Summed straight into the kept shard: no shard-sized tensor to allocate and add.
        comm_.transport->reduce_scatter_add(pieces, reduced_, world, "reduce_scatter of " + what);
      } else {
        auto part = at::empty({layout_.shard_numel}, shard_.options().dtype(dtype));
        comm_.transport->reduce_scatter(pieces, part, world, "reduce_scatter of " + what);
        pieces.tensors.clear();  // autograd's gradients: not needed across replicas
        if (comm_.replica_group) all_reduce_across_replicas(*comm_.replica_group, part, what);
        reduced_.add_(part);
      }
    }
    flat = at::Tensor();
    const double seconds = seconds_since(start);
    comm_.record([seconds](auto& times) { times.reduce_s += seconds; });
  });
}

void ShardedUnit::finish_backward(const std::vector<bool>& used_on_any_rank) {
  reshard();
  // The step changes the shards: the next forward gathers them (SHARD_GRAD_OP and ZeRO-1 keep
  // the gathered buffer's memory).
  mark_stale();
  for (size_t k = 0; k < params_.size(); ++k) {
    // A parameter no rank used keeps its gradient as it was (undefined), as in one process.
    const bool kept = used_on_any_rank[first_index_ + k] || params_[k].had_grad;
    params_[k].param.mutable_grad() = kept ? params_[k].kept_grad : at::Tensor();
  }
}

at::Tensor ShardedUnit::own_gradients() const {
  const bool whole = reduced_.numel() != layout_.shard_numel;
  return whole && plan_.sharded ? reduced_.narrow(0, rank_ * layout_.shard_numel, layout_.shard_numel) : reduced_;
}

at::Tensor ShardedUnit::all_gather(const at::Tensor& shard, const std::string& what) const {
  auto flat = at::empty({layout_.padded_numel()}, shard.options());
  comm_.transport->all_gather(shard, flat, "all_gather of unit '" + name_ + "''s " + what);
  return flat;
}

at::Tensor ShardedUnit::whole_of(size_t k, const at::Tensor& flat) const {
  return flat.narrow(0, layout_.offsets[k], layout_.numels[k]).view(layout_.shapes[k]);
}

void ShardedUnit::load_whole(size_t k, const at::Tensor& value) {
  torch::NoGradGuard no_grad;
  if (!plan_.sharded) {
    params_[k].whole.copy_(value.view_as(params_[k].whole));
    return;
  }
  const auto mine = piece(k);
  shard_.narrow(0, mine.shard_offset, mine.numel).copy_(value.reshape({-1}).narrow(0, mine.begin, mine.numel));
}

void ShardedUnit::load_piece(size_t k, const at::Tensor& value) {
  torch::NoGradGuard no_grad;
  if (!plan_.sharded) {
    params_[k].whole.copy_(value.view(layout_.shapes[k]));
  } else {
    params_[k].piece.copy_(value);
  }
}

}  // namespace detail
}  // namespace distributed
}  // namespace lockstep
