#include <lockstep/distributed/fsdp/fully_sharded.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <unordered_map>
#include <unordered_set>

#include <sys/mman.h>

#include <c10/core/StorageImpl.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/torch.h>

#include <lockstep/core/error.h>
#include <lockstep/distributed/collectives.h>
#include <lockstep/distributed/module_state.h>

#include "../comm/hosts.h"
#include "activation_checkpoint.h"
#include "comm_thread.h"
#include "wrap_policy.h"

namespace lockstep {
namespace distributed {
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

// FULL_SHARD frees a unit's whole parameters by giving their storage zero bytes, and gathers into
// the same storage again, so that the tensors that forward saved for backward see the gathered
// values (PyTorch's FSDP does the same).
void free_storage(const at::Tensor& tensor) {
  auto* storage = tensor.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, tensor.device()));
  storage->set_nbytes(0);
}

// A unit is gathered into fresh memory twice a step: in 2 MiB pages where the kernel gives them
// on request (transparent huge pages "madvise", Debian's default), its first touch faults 512
// times less often.
void ask_for_huge_pages(const void* data, size_t bytes) {
  constexpr uintptr_t kHugePage = 2 << 20;
  const auto begin = (reinterpret_cast<uintptr_t>(data) + kHugePage - 1) & ~(kHugePage - 1);
  const auto end = (reinterpret_cast<uintptr_t>(data) + bytes) & ~(kHugePage - 1);
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
}

void allocate_storage(const at::Tensor& tensor) {
  auto* storage = tensor.storage().unsafeGetStorageImpl();
  const size_t bytes = static_cast<size_t>(tensor.numel()) * tensor.element_size();
  if (storage->nbytes() == bytes) return;
  storage->set_data_ptr_noswap(storage->allocator()->allocate(bytes));
  storage->set_nbytes(bytes);
  if (tensor.device().is_cpu()) ask_for_huge_pages(storage->data(), bytes);
}

// The shared memory slot of each rank: larger units go through it in pieces. A slot the size of
// the largest unit would put world size x that unit in every rank's resident memory.
constexpr int64_t kSharedMemorySlotBytes = 16 << 20;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Runs a child unit's forward between the engine's gather and reshard: it takes the place of the
// child in its Sequential (the child itself stays registered, so names do not change).
class UnitForward : public torch::nn::Module {
 public:
  UnitForward(FullyShardedDataParallelBase* engine, size_t unit, torch::nn::AnyModule inner, bool checkpointed)
      : engine_(engine), unit_(unit), inner_(std::move(inner)), checkpointed_(checkpointed) {}
  at::Tensor forward(at::Tensor input) {
    engine_->before_unit_forward(unit_);
    // With a param_dtype the unit computes in it: its input cast there, its output back.
    const auto dtype = engine_->options().param_dtype();
    const bool cast = dtype && input.is_floating_point() && input.scalar_type() != *dtype;
    const auto in = cast ? input.to(*dtype) : input;
    auto output = checkpointed_ ? detail::checkpointed_forward(inner_, in) : inner_.forward(in);
    if (cast && output.is_floating_point()) output = output.to(input.scalar_type());
    engine_->after_unit_forward(unit_, output);
    return output;
  }
  const torch::nn::AnyModule& inner() const { return inner_; }

 private:
  FullyShardedDataParallelBase* engine_;
  size_t unit_;
  torch::nn::AnyModule inner_;
  bool checkpointed_;
};

// Runs before a parameter's gradient is accumulated.
class BeforeAccumulation : public torch::autograd::FunctionPreHook {
 public:
  explicit BeforeAccumulation(std::function<void()> run) : run_(std::move(run)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    run_();
    return grads;
  }

 private:
  std::function<void()> run_;
};

// An all-reduce of `tensor` in place; bfloat16 goes as float32 (Gloo has no bfloat16 in LibTorch 1.13).
void all_reduce_wide(ProcessGroup& group, at::Tensor& tensor, ReduceOp op, const std::string& tag) {
  if (tensor.scalar_type() != at::kBFloat16) {
    all_reduce(group, tensor, op, CollectiveOptions().tag(tag));
    return;
  }
  auto wide = tensor.to(at::kFloat);
  all_reduce(group, wide, op, CollectiveOptions().tag(tag));
  tensor.copy_(wide);
}

// Parameters sharded at rest, gathered around each unit's forward and backward.
bool shards_at_rest(ShardingStrategy strategy) {
  return strategy == ShardingStrategy::full_shard || strategy == ShardingStrategy::hybrid_shard;
}

// Every rank keeps the whole gradients, all-reduced (NO_SHARD, ZeRO-1); otherwise its shard of them.
bool keeps_whole_gradients(ShardingStrategy strategy) {
  return strategy == ShardingStrategy::no_shard || strategy == ShardingStrategy::shard_optimizer_state;
}

}  // namespace

struct FullyShardedDataParallelBase::Unit {
  std::string name;  // "" for the root
  std::vector<at::Tensor> params;
  std::vector<std::string> names;
  FlatLayout layout;
  at::Tensor full;     // every rank's shard together: the whole parameters, padded
  at::Tensor shard;    // this rank's part: an alias into `full`, or its own memory with FULL_SHARD
  at::Tensor reduced;  // the gradients this rank keeps: whole (NO_SHARD, ZeRO-1) or its shard
  at::Tensor flat_grad;  // NO_SHARD, ZeRO-1: this backward's whole gradients, all-reduced from here
  std::vector<at::Tensor> whole;   // parameter i shaped, in `full`
  std::vector<at::Tensor> pieces;  // parameter i's piece, in `shard`
  std::vector<at::Tensor> grads;   // parameter i's kept gradient (whole or piece), in `reduced`
  std::vector<bool> arrived;       // parameter i got its gradient in this backward
  std::vector<bool> had_grad;      // parameter i had a gradient before this backward
  size_t first_parameter = 0;      // parameter i is where_[first_parameter + i]
  size_t pending = 0;
  bool gathered = true;  // `full` holds the current parameters, once `gathering` completes
  detail::CommThread::Ticket gathering;  // an all-gather into `full` on the communication thread
  bool showing_whole = true;
  // Where the unit was a child of a Sequential: its entry there, restored on destruction.
  torch::nn::SequentialImpl* parent = nullptr;
  size_t index_in_parent = 0;
  torch::nn::AnyModule original;
};

FullyShardedDataParallelBase::FullyShardedDataParallelBase(std::shared_ptr<torch::nn::Module> module,
                                                           ProcessGroup& group, ShardingOptions options)
    : module_(std::move(module)), group_(group), options_(std::move(options)), shard_group_(&group_) {
  if (!module_) throw UsageError("FullyShardedDataParallel: the module is null.");
  if (options_.auto_wrap_min_params() < 0) {
    throw UsageError("ShardingOptions: auto_wrap_min_params must be 0 (one unit) or more (given " +
                     std::to_string(options_.auto_wrap_min_params()) + ").");
  }
  if (options_.hybrid_shard_size() != 0 && options_.sharding_strategy() != ShardingStrategy::hybrid_shard) {
    throw UsageError("ShardingOptions: hybrid_shard_size " + std::to_string(options_.hybrid_shard_size()) +
                     " is for HYBRID_SHARD, but the sharding is " + to_string(options_.sharding_strategy()) +
                     ". Set sharding_strategy(ShardingStrategy::hybrid_shard), or drop it.");
  }
  for (const auto& [dtype, option] : {std::make_pair(options_.param_dtype(), "param_dtype"),
                                      std::make_pair(options_.reduce_dtype(), "reduce_dtype")}) {
    if (dtype && !at::isFloatingType(*dtype)) {
      throw UsageError(std::string("ShardingOptions: ") + option + " " + c10::toString(*dtype) +
                       " is not a floating dtype; give at::kBFloat16, at::kHalf or at::kFloat.");
    }
  }
  if (options_.param_dtype() && (options_.sharding_strategy() == ShardingStrategy::no_shard ||
                                 options_.sharding_strategy() == ShardingStrategy::shard_optimizer_state)) {
    throw UsageError("ShardingOptions: param_dtype needs parameters gathered before forward (FULL_SHARD, "
                     "HYBRID_SHARD or SHARD_GRAD_OP), but the sharding is " + to_string(options_.sharding_strategy()) +
                     ". Change the sharding, or compute in low precision with autocast (--precision bf16-mixed).");
  }
  verify_same_parameters(*module_, group_, "FullyShardedDataParallel");
  std::vector<at::Tensor> state;
  for (const auto& p : module_->parameters()) state.push_back(p);
  for (const auto& b : module_->buffers()) {
    if (b.defined()) state.push_back(b);
  }
  broadcast_tensors(group_, state, "FSDP parameters and buffers");
  if (options_.sharding_strategy() == ShardingStrategy::hybrid_shard) make_hybrid_groups();
  build_units();
  int64_t largest = 0;
  for (const auto& unit : units_) largest = std::max(largest, unit->layout.padded_numel() * unit->full.element_size());
  transport_ = choose_shard_transport(*shard_group_, std::min(largest, kSharedMemorySlotBytes), options_.shared_memory(),
                                      &why_not_shared_memory_);
  next_in_forward_.assign(units_.size(), SIZE_MAX);
  previous_in_forward_.assign(units_.size(), SIZE_MAX);
  comm_ = std::make_unique<detail::CommThread>();
  wrapped_ = WrappedParameters(*module_, "FullyShardedDataParallel");
}

FullyShardedDataParallelBase::~FullyShardedDataParallelBase() {
  comm_.reset();  // finishes what is queued
  for (size_t i = 0; i < accumulators_.size(); ++i) {
    accumulators_[i]->del_post_hook(hook_keys_[i]);
    auto& pre = accumulators_[i]->pre_hooks();
    pre.erase(std::remove_if(pre.begin(), pre.end(), [&](const auto& hook) { return hook.get() == pre_hooks_[i]; }),
              pre.end());
  }
  for (auto& unit : units_) {
    if (unit->parent) *(unit->parent->begin() + static_cast<std::ptrdiff_t>(unit->index_in_parent)) = unit->original;
  }
}

const FlatLayout& FullyShardedDataParallelBase::layout(size_t index) const { return units_.at(index)->layout; }

void FullyShardedDataParallelBase::make_hybrid_groups() {
  const int world = group_.world_size();
  int size = options_.hybrid_shard_size();
  if (size < 0 || size > world || (size > 0 && world % size != 0)) {
    throw UsageError("ShardingOptions: hybrid_shard_size " + std::to_string(size) + " does not divide the " +
                     std::to_string(world) + " ranks into groups; give a divisor of " + std::to_string(world) +
                     ", or 0 for the ranks of each host.");
  }
  if (size == 0) {
    const auto hosts = detail::ranks_by_host(detail::gather_strings(group_, detail::host_key(), "FSDP hosts"));
    size = static_cast<int>(hosts.front().size());
    for (const auto& ranks : hosts) {
      bool consecutive = static_cast<int>(ranks.size()) == size;
      for (size_t k = 0; consecutive && k < ranks.size(); ++k) consecutive = ranks[k] == ranks.front() + static_cast<int>(k);
      if (!consecutive) {
        throw UsageError("HYBRID_SHARD: the ranks of each host are not consecutive, or not as many on every host (" +
                         std::to_string(hosts.size()) + " hosts for " + std::to_string(world) +
                         " ranks); set ShardingOptions::hybrid_shard_size to the ranks that shard one copy.");
      }
    }
  }
  if (size == world) return;  // one group: FULL_SHARD
  // Every rank creates every subgroup, in one order, keeping its own.
  for (int first = 0; first < world; first += size) {
    std::vector<int> ranks(static_cast<size_t>(size));
    std::iota(ranks.begin(), ranks.end(), first);
    if (auto mine = group_.new_subgroup(ranks)) own_shard_group_ = std::move(mine);
  }
  for (int offset = 0; offset < size; ++offset) {
    std::vector<int> ranks;
    for (int r = offset; r < world; r += size) ranks.push_back(r);
    if (auto mine = group_.new_subgroup(ranks)) replica_group_ = std::move(mine);
  }
  shard_group_ = own_shard_group_.get();
}

void FullyShardedDataParallelBase::build_units() {
  const auto children = detail::find_units(*module_, options_);
  if (options_.param_dtype() && children.empty()) {
    throw UsageError("ShardingOptions: param_dtype " + std::string(c10::toString(*options_.param_dtype())) +
                     " applies to child units, and the module has none (the root unit keeps the parameters' "
                     "dtype). Make units with auto_wrap_min_params or auto_wrap_module_types.");
  }
  // Unit 0 is the root: every parameter that requires grad and is in no child unit.
  std::unordered_map<const void*, size_t> unit_of;
  std::vector<std::vector<std::pair<std::string, at::Tensor>>> members(children.size() + 1);
  for (size_t c = 0; c < children.size(); ++c) {
    auto child = children[c].parent->ptr(children[c].index);
    for (const auto& item : child->named_parameters()) {
      if (!item.value().requires_grad() || !unit_of.emplace(item.value().unsafeGetTensorImpl(), c + 1).second) continue;
      members[c + 1].push_back({children[c].name + "." + item.key(), item.value()});
    }
  }
  for (const auto& item : module_->named_parameters()) {
    if (!item.value().requires_grad()) continue;
    const auto found = unit_of.find(item.value().unsafeGetTensorImpl());
    if (found == unit_of.end()) {
      unit_of.emplace(item.value().unsafeGetTensorImpl(), 0);
      members[0].push_back({item.key(), item.value()});
    } else if (found->second != 0 && item.key().rfind(children[found->second - 1].name + ".", 0) != 0) {
      throw UsageError("FullyShardedDataParallel: parameter '" + item.key() + "' is shared with unit '" +
                       children[found->second - 1].name +
                       "', which gathers it only around its own forward. Raise auto_wrap_min_params so that "
                       "both users are in one unit, or do not share the parameter.");
    }
  }

  const int rank = shard_group_->rank();
  const bool sharded = options_.sharding_strategy() != ShardingStrategy::no_shard;
  const bool whole_grads = keeps_whole_gradients(options_.sharding_strategy());
  torch::NoGradGuard no_grad;
  for (size_t u = 0; u < members.size(); ++u) {
    auto unit = std::make_unique<Unit>();
    unit->name = u == 0 ? "" : children[u - 1].name;
    for (auto& member : members[u]) {
      unit->names.push_back(member.first);
      unit->params.push_back(member.second);
    }
    unit->layout = FlatLayout::of(unit->params, shard_group_->world_size());
    const auto& layout = unit->layout;
    const auto options = unit->params.empty() ? at::TensorOptions(at::kFloat) : unit->params.front().options();
    auto flat = at::zeros({layout.padded_numel()}, options);
    for (size_t i = 0; i < unit->params.size(); ++i) {
      flat.narrow(0, layout.offsets[i], layout.numels[i]).copy_(unit->params[i].reshape({-1}));
    }
    // A child unit with a param_dtype is gathered in it; its shard keeps the parameters' dtype.
    const bool low = u > 0 && options_.param_dtype() && *options_.param_dtype() != options.dtype().toScalarType();
    unit->full = low ? flat.to(*options_.param_dtype()) : flat;
    const int64_t mine = rank * layout.shard_numel;
    unit->shard = shards_at_rest(options_.sharding_strategy()) || low
                      ? flat.narrow(0, mine, layout.shard_numel).clone()
                      : alias(unit->full, mine, {layout.shard_numel});
    unit->first_parameter = where_.size();
    unit->reduced = at::zeros({whole_grads ? layout.padded_numel() : layout.shard_numel}, options);
    for (size_t i = 0; i < unit->params.size(); ++i) {
      auto& p = unit->params[i];
      const auto piece = layout.piece(i, rank);
      unit->whole.push_back(alias(unit->full, layout.offsets[i], p.sizes()));
      unit->pieces.push_back(alias(unit->shard, piece.shard_offset, {piece.numel}));
      if (!sharded) {
        unit->grads.push_back(alias(unit->reduced, layout.offsets[i], p.sizes()));
      } else {
        unit->grads.push_back(alias(unit->reduced, (whole_grads ? mine : 0) + piece.shard_offset, {piece.numel}));
      }
      // The accumulator is made while the parameter has its whole shape, and held, so that every
      // backward's gradients are checked against that shape.
      where_.push_back({u, i});
      const size_t index = where_.size() - 1;
      auto accumulator = torch::autograd::impl::grad_accumulator(p);
      hook_keys_.push_back(accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
          [this, index](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
            on_gradient(index);
            return outputs;
          })));
      auto before = std::make_unique<BeforeAccumulation>([this, index] { before_gradient(index); });
      pre_hooks_.push_back(before.get());
      accumulator->add_pre_hook(std::move(before));
      accumulators_.push_back(std::move(accumulator));
      p.set_data(unit->whole[i]);
      p.mutable_grad() = at::Tensor();
    }
    unit->arrived.assign(unit->params.size(), false);
    unit->had_grad.assign(unit->params.size(), false);
    if (u > 0) {
      auto& child = children[u - 1];
      unit->parent = child.parent;
      unit->index_in_parent = child.index;
      auto entry = child.parent->begin() + static_cast<std::ptrdiff_t>(child.index);
      unit->original = *entry;
      *entry = torch::nn::AnyModule(std::make_shared<UnitForward>(this, u, unit->original, child.checkpointed));
    }
    units_.push_back(std::move(unit));
    reshard(*units_.back());
  }
  // Gradients arrive from the last layers first: child units in reverse order, the root last.
  for (size_t u = units_.size(); u-- > 1;) reduce_order_.push_back(u);
  reduce_order_.push_back(0);
}

void FullyShardedDataParallelBase::prefetch(Unit& unit) {
  if (unit.gathered) return;
  Unit* u = &unit;
  unit.gathering = comm_->submit([this, u] {
    const auto start = std::chrono::steady_clock::now();
    // Allocated here, in queue order: after the reductions queued before it have freed theirs.
    allocate_storage(u->full);
    // In the unit's compute dtype (param_dtype): half the bytes with bfloat16.
    const auto shard = u->shard.scalar_type() == u->full.scalar_type() ? u->shard : u->shard.to(u->full.scalar_type());
    transport_->all_gather(shard, u->full, "all_gather of unit '" + u->name + "''s parameters");
    std::lock_guard<std::mutex> lock(times_mutex_);
    times_.all_gathers += 1;
    times_.all_gather_s += seconds_since(start);
  });
  unit.gathered = true;
}

void FullyShardedDataParallelBase::wait_gathered(Unit& unit) {
  if (!unit.gathering.valid()) return;
  const auto start = std::chrono::steady_clock::now();
  const auto ticket = std::move(unit.gathering);
  unit.gathering = {};
  try {
    // Each collective is bounded by the group's timeout; twice that covers one queued behind another.
    detail::CommThread::wait(ticket, group_.timeout() * 2, group_.describe(),
                             "the all_gather of unit '" + unit.name + "''s parameters");
  } catch (const std::exception& e) {
    fail(e.what());
  }
  std::lock_guard<std::mutex> lock(times_mutex_);
  times_.all_gather_waited_s += seconds_since(start);
}

void FullyShardedDataParallelBase::settle() {
  try {
    comm_->drain(group_.timeout() * 2, group_.describe());
  } catch (const std::exception& e) {
    fail(e.what());
  }
  for (auto& unit : units_) unit->gathering = {};
}

void FullyShardedDataParallelBase::gather(Unit& unit) {
  prefetch(unit);
  wait_gathered(unit);
  if (!unit.showing_whole) show(unit, true);
}

void FullyShardedDataParallelBase::show(Unit& unit, bool whole) {
  for (size_t i = 0; i < unit.params.size(); ++i) {
    auto& p = unit.params[i];
    const auto& value = whole ? unit.whole[i] : unit.pieces[i];
    const bool retyped = p.scalar_type() != value.scalar_type();
    p.set_data(value);
    if (retyped) {
      // set_data to another dtype lets go of the parameter's gradient accumulator; ours (with its
      // hooks, and the whole shape and own dtype that incoming gradients are cast to) goes back.
      auto* meta = torch::autograd::impl::get_autograd_meta(p);
      meta->grad_accumulator_ = decltype(meta->grad_accumulator_)(accumulators_[unit.first_parameter + i]);
    }
  }
  unit.showing_whole = whole;
}

void FullyShardedDataParallelBase::reshard(Unit& unit) {
  if (options_.sharding_strategy() == ShardingStrategy::no_shard) return;
  if (unit.showing_whole) show(unit, false);
  if (shards_at_rest(options_.sharding_strategy()) && unit.gathered) {
    wait_gathered(unit);  // a prefetch not used: let it land first
    free_storage(unit.full);
    unit.gathered = false;
  }
}

void FullyShardedDataParallelBase::prepare_forward() {
  if (!error_.empty()) throw DistributedError(error_);
  wrapped_.check(*module_);
  const bool training = torch::GradMode::is_enabled() && module_->is_training();
  if (training) forward_prepared_ = true;
  if (options_.sharding_strategy() != ShardingStrategy::no_shard) check_every_rank_forwards(training);
  gather(*units_.front());
  if (shards_at_rest(options_.sharding_strategy())) {
    if (forward_order_known_ && !forward_order_.empty()) prefetch(*units_[forward_order_.front()]);
  } else {
    // Each child unit waits for its own gather before its forward (before_unit_forward).
    for (auto& unit : units_) prefetch(*unit);
  }
}

// A forward that only some ranks make would pair its gathers with another forward's on the other
// ranks and fail far from here, or hang. So the ranks first tell each other what forward they
// are in (one number each): a training forward on one rank and an evaluation on another are
// refused here, on both.
void FullyShardedDataParallelBase::check_every_rank_forwards(bool training) {
  if (shard_group_->world_size() == 1) return;
  const auto mine = at::full({1}, training ? 1.0f : 0.0f);
  auto all = at::empty({shard_group_->world_size()}, at::kFloat);
  const auto ticket = comm_->submit([this, mine, all]() mutable {
    transport_->all_gather(mine, all, "all_gather of the kind of forward each rank is in");
  });
  try {
    detail::CommThread::wait(ticket, group_.timeout() * 2, group_.describe(), "the all_gather of the kind of forward");
  } catch (const std::exception& e) {
    fail(e.what());
  }
  std::string others;
  const auto* kinds = all.data_ptr<float>();
  for (int r = 0; r < shard_group_->world_size(); ++r) {
    if ((kinds[r] == 1.0f) != training) others += (others.empty() ? "" : ", ") + std::to_string(r);
  }
  if (others.empty()) return;
  const auto kind = [](bool train) {
    return std::string(train ? "a training forward" : "an evaluation forward (no grad, or eval())");
  };
  fail(group_.describe() + ": FullyShardedDataParallel: this rank is in " + kind(training) + " while rank(s) " + others +
       " of its shard group are in " + kind(!training) + ". Under " + to_string(options_.sharding_strategy()) +
       " every forward gathers parameters from every rank, so every rank must make the same forwards: evaluate on "
       "all ranks (the Trainer's validation does), or take full_state_dict() on all ranks and evaluate an unwrapped "
       "copy on one. NO_SHARD forwards need no other rank.");
}

void FullyShardedDataParallelBase::begin_backward() {
  if (!forward_prepared_) {
    fail(group_.describe() + ": FullyShardedDataParallel: a backward through a forward that did not go through "
         "the wrapper. Call forward() (or prepare_forward() before the module's own forward).");
  }
  torch::NoGradGuard no_grad;
  for (auto& unit : units_) {
    if (options_.sharding_strategy() == ShardingStrategy::shard_optimizer_state) {
      // Only this rank's part of the whole gradients is kept from one backward to the next.
      const int64_t mine = shard_group_->rank() * unit->layout.shard_numel;
      unit->reduced.narrow(0, 0, mine).zero_();
      unit->reduced.narrow(0, mine + unit->layout.shard_numel, unit->reduced.numel() - mine - unit->layout.shard_numel)
          .zero_();
    }
    unit->arrived.assign(unit->params.size(), false);
    unit->pending = unit->params.size();
  }
  next_reduced_ = 0;
  in_backward_ = true;
  torch::autograd::Engine::get_default_engine().queue_callback([this] { finish_backward(); });
}

void FullyShardedDataParallelBase::set_aside(Unit& unit, size_t i) {
  // The kept gradient as the optimizer left it (zeroed in place, set to none, or accumulating).
  // Then autograd adds this backward's gradient in place into the unit's flat buffer (whole
  // gradients), or, sharded, keeps it as the parameter's gradient without a copy: the
  // reduce-scatter reads it there, and no flat buffer the unit's size is needed beside it.
  torch::NoGradGuard no_grad;
  auto& grad = unit.params[i].mutable_grad();
  unit.had_grad[i] = grad.defined();
  if (!grad.defined()) {
    unit.grads[i].zero_();
  } else if (!is_alias_of(grad, unit.grads[i])) {
    if (grad.numel() != unit.grads[i].numel()) {
      fail(group_.describe() + ": FullyShardedDataParallel: parameter '" + unit.names[i] + "' has a gradient of " +
           std::to_string(grad.numel()) + " elements where its shard has " + std::to_string(unit.grads[i].numel()) +
           "; set gradients only through backward.");
    }
    unit.grads[i].copy_(grad.reshape(unit.grads[i].sizes()));
  }
  if (!keeps_whole_gradients(options_.sharding_strategy())) {
    grad = at::Tensor();
    return;
  }
  if (!unit.flat_grad.defined()) unit.flat_grad = at::zeros({unit.layout.padded_numel()}, unit.shard.options());
  grad = alias(unit.flat_grad, unit.layout.offsets[i], unit.layout.shapes[i]);
}

void FullyShardedDataParallelBase::before_gradient(size_t parameter) {
  if (!in_backward_) begin_backward();
  const auto [u, i] = where_[parameter];
  if (!units_[u]->arrived[i]) set_aside(*units_[u], i);
}

void FullyShardedDataParallelBase::on_gradient(size_t parameter) {
  const auto [u, i] = where_[parameter];
  auto& unit = *units_[u];
  if (unit.arrived[i]) {
    fail(group_.describe() + ": FullyShardedDataParallel: parameter '" + unit.names[i] +
         "' received its gradient twice in one backward (a second backward through the same graph). Run one "
         "backward per forward.");
  }
  unit.arrived[i] = true;
  if (--unit.pending == 0) reduce_ready_units();
}

void FullyShardedDataParallelBase::reduce_ready_units() {
  // In one order on every rank, whatever order the units' gradients complete in.
  while (next_reduced_ < reduce_order_.size() && units_[reduce_order_[next_reduced_]]->pending == 0) {
    reduce(*units_[reduce_order_[next_reduced_++]]);
  }
}

void FullyShardedDataParallelBase::reduce(Unit& unit) {
  torch::NoGradGuard no_grad;
  const bool whole = keeps_whole_gradients(options_.sharding_strategy());
  std::vector<at::Tensor> pieces;  // sharded: this backward's gradient of each parameter that got one
  std::vector<int64_t> offsets;
  for (size_t i = 0; i < unit.params.size(); ++i) {
    if (!unit.arrived[i]) set_aside(unit, i);  // no gradient in this backward: zero
    auto& grad = unit.params[i].mutable_grad();
    if (!whole && grad.defined()) {
      pieces.push_back(grad.contiguous().view(-1));
      offsets.push_back(unit.layout.offsets[i]);
    }
    grad = at::Tensor();  // the whole gradient is in flat_grad, or in `pieces`
  }
  // The parameters are not needed again in this backward: free them before reducing.
  if (shards_at_rest(options_.sharding_strategy())) reshard(unit);
  auto flat = std::move(unit.flat_grad);
  unit.flat_grad = at::Tensor();
  if (whole && !flat.defined()) flat = at::zeros({unit.layout.padded_numel()}, unit.shard.options());  // no parameters
  Unit* u = &unit;
  comm_->submit([this, u, flat = std::move(flat), pieces = std::move(pieces), offsets = std::move(offsets)]() mutable {
    torch::NoGradGuard no_grad;
    const auto start = std::chrono::steady_clock::now();
    const std::string what = "the gradients of unit '" + u->name + "'";
    const auto dtype = options_.reduce_dtype().value_or(u->shard.scalar_type());
    if (flat.defined()) {
      if (flat.scalar_type() != dtype) flat = flat.to(dtype);
      // All-reduced as a reduce-scatter and an all-gather: summed in rank order, the bits of
      // DDP's and FULL_SHARD's sums (Gloo's all-reduce sums 3 or more ranks in another order).
      if (group_.world_size() > 1) {
        auto part = at::empty({u->layout.shard_numel}, flat.options());
        transport_->reduce_scatter(flat, part, group_.world_size(), "reduce_scatter of " + what);
        transport_->all_gather(part, flat, "all_gather of " + what);
      }
      u->reduced.add_(flat);
    } else {
      for (auto& piece : pieces) {
        if (piece.scalar_type() != dtype) piece = piece.to(dtype);
      }
      FlatPieces flat_pieces(u->layout.padded_numel(), std::move(pieces), std::move(offsets));
      if (!replica_group_ && u->reduced.scalar_type() == dtype) {
        // Summed straight into the kept shard: no shard-sized tensor to allocate and add.
        transport_->reduce_scatter_add(flat_pieces, u->reduced, group_.world_size(), "reduce_scatter of " + what);
      } else {
        auto part = at::empty({u->layout.shard_numel}, u->shard.options().dtype(dtype));
        transport_->reduce_scatter(flat_pieces, part, group_.world_size(), "reduce_scatter of " + what);
        flat_pieces.tensors.clear();  // autograd's gradients: not needed across replicas
        if (replica_group_) {
          all_reduce_wide(*replica_group_, part, ReduceOp::sum, "FSDP all_reduce across replicas of " + what);
        }
        u->reduced.add_(part);
      }
    }
    flat = at::Tensor();
    std::lock_guard<std::mutex> lock(times_mutex_);
    times_.reduce_s += seconds_since(start);
  });
}

void FullyShardedDataParallelBase::finish_backward() {
  // Units with parameters that got no gradient (not used by this forward) count them as zero.
  for (auto& unit : units_) unit->pending = 0;
  reduce_ready_units();
  const auto start = std::chrono::steady_clock::now();
  settle();
  {
    std::lock_guard<std::mutex> lock(times_mutex_);
    times_.reduce_waited_s += seconds_since(start);
  }
  if (!forward_order_known_) learn_forward_order();
  const auto used = used_on_any_rank();
  for (auto& unit : units_) {
    reshard(*unit);
    // With ZeRO-1 and SHARD_GRAD_OP `full` keeps its memory; the step changes the shards, so the
    // next forward gathers them.
    if (options_.sharding_strategy() != ShardingStrategy::no_shard) unit->gathered = false;
    for (size_t i = 0; i < unit->params.size(); ++i) {
      // A parameter no rank used keeps its gradient as it was (undefined), as in one process.
      const bool kept = used[unit->first_parameter + i] || unit->had_grad[i];
      unit->params[i].mutable_grad() = kept ? unit->grads[i] : at::Tensor();
    }
  }
  in_backward_ = false;
  forward_prepared_ = false;
}

std::vector<bool> FullyShardedDataParallelBase::used_on_any_rank() {
  auto used = at::zeros({static_cast<int64_t>(where_.size())}, at::kInt);
  auto* flags = used.data_ptr<int32_t>();
  for (size_t k = 0; k < where_.size(); ++k) flags[k] = units_[where_[k].first]->arrived[where_[k].second] ? 1 : 0;
  if (group_.world_size() > 1 && !where_.empty()) {
    try {
      all_reduce(group_, used, ReduceOp::max, CollectiveOptions().tag("FSDP parameters used in backward"));
    } catch (const std::exception& e) {
      fail(e.what());
    }
  }
  flags = used.data_ptr<int32_t>();
  return std::vector<bool>(flags, flags + where_.size());
}

void FullyShardedDataParallelBase::learn_forward_order() {
  forward_order_known_ = true;
  for (size_t k = 0; k + 1 < forward_order_.size(); ++k) {
    next_in_forward_[forward_order_[k]] = forward_order_[k + 1];
    previous_in_forward_[forward_order_[k + 1]] = forward_order_[k];
  }
  // Gradients are ready in the reverse of that order: reduce them so (the same on every rank,
  // which ran the same forward), then units that forward did not run, the root last.
  std::vector<size_t> order(forward_order_.rbegin(), forward_order_.rend());
  for (size_t u : reduce_order_) {
    if (std::find(order.begin(), order.end(), u) == order.end()) order.push_back(u);
  }
  reduce_order_ = std::move(order);
}

void FullyShardedDataParallelBase::before_unit_forward(size_t unit) {
  if (!forward_order_known_ && forward_prepared_ &&
      std::find(forward_order_.begin(), forward_order_.end(), unit) == forward_order_.end()) {
    forward_order_.push_back(unit);
  }
  gather(*units_[unit]);
  if (shards_at_rest(options_.sharding_strategy()) && next_in_forward_[unit] != SIZE_MAX) {
    prefetch(*units_[next_in_forward_[unit]]);
  }
}

void FullyShardedDataParallelBase::after_unit_forward(size_t unit, const at::Tensor& output) {
  if (!shards_at_rest(options_.sharding_strategy())) return;
  // The last unit of forward is the first of backward: it stays gathered for it.
  const bool backward_next = output.requires_grad() && forward_order_known_ && unit == forward_order_.back();
  if (!backward_next) reshard(*units_[unit]);
  if (!output.requires_grad()) return;
  // Backward reaches this output before anything that used the unit's parameters; the unit
  // before it in forward is gathered meanwhile.
  output.register_hook([this, unit](const at::Tensor&) {
    gather(*units_[unit]);
    if (previous_in_forward_[unit] != SIZE_MAX) prefetch(*units_[previous_in_forward_[unit]]);
  });
}

FullyShardedDataParallelBase::CommTimes FullyShardedDataParallelBase::comm_times() const {
  std::lock_guard<std::mutex> lock(times_mutex_);
  return times_;
}

void FullyShardedDataParallelBase::reset_comm_times() {
  std::lock_guard<std::mutex> lock(times_mutex_);
  times_ = CommTimes();
}

double FullyShardedDataParallelBase::CommTimes::all_gather_hidden_share() const {
  return all_gather_s > 0 ? std::max(0.0, 1.0 - all_gather_waited_s / all_gather_s) : 0.0;
}

double FullyShardedDataParallelBase::clip_grad_norm(double max_norm, double norm_type) {
  if (!error_.empty()) throw DistributedError(error_);
  settle();  // the training thread's collectives do not overtake queued ones
  if (!(max_norm > 0) || !(norm_type > 0)) {
    throw UsageError("FullyShardedDataParallel::clip_grad_norm: max_norm and norm_type must be positive (given " +
                     std::to_string(max_norm) + " and " + std::to_string(norm_type) + ").");
  }
  torch::NoGradGuard no_grad;
  const bool infinite = std::isinf(norm_type);
  const bool replicated = options_.sharding_strategy() == ShardingStrategy::no_shard;
  // This rank's part of every unit's gradients: each element of the model once over the ranks.
  std::vector<at::Tensor> parts;
  for (auto& unit : units_) {
    const bool whole = unit->reduced.numel() != unit->layout.shard_numel;
    parts.push_back(whole && !replicated
                        ? unit->reduced.narrow(0, shard_group_->rank() * unit->layout.shard_numel, unit->layout.shard_numel)
                        : unit->reduced);
  }
  auto local = at::zeros({1}, at::kDouble);
  for (const auto& part : parts) {
    if (part.numel() == 0) continue;
    const auto norm = part.abs().max().to(at::kDouble);
    local = infinite ? at::maximum(local, norm) : local + part.to(at::kDouble).abs().pow(norm_type).sum();
  }
  if (!replicated) {
    // Over the ranks that shard: with HYBRID_SHARD the other groups hold the same gradients.
    all_reduce(*shard_group_, local, infinite ? ReduceOp::max : ReduceOp::sum, CollectiveOptions().tag("FSDP clip_grad_norm"));
  }
  const double total = infinite ? local.item<double>() : std::pow(local.item<double>(), 1.0 / norm_type);
  const double coefficient = max_norm / (total + 1e-6);
  if (coefficient < 1) {
    for (auto& part : parts) part.mul_(coefficient);
  }
  return total;
}

std::vector<std::pair<std::string, at::Tensor>> FullyShardedDataParallelBase::full_state_dict() {
  if (!error_.empty()) throw DistributedError(error_);
  settle();  // the training thread's collectives do not overtake queued ones
  torch::NoGradGuard no_grad;
  std::unordered_map<const void*, at::Tensor> whole;
  for (auto& unit : units_) {
    auto flat = at::empty({unit->layout.padded_numel()}, unit->shard.options());
    transport_->all_gather(unit->shard, flat, "all_gather of unit '" + unit->name + "''s parameters for a state dict");
    for (size_t i = 0; i < unit->params.size(); ++i) {
      whole[unit->params[i].unsafeGetTensorImpl()] =
          flat.narrow(0, unit->layout.offsets[i], unit->layout.numels[i]).view(unit->layout.shapes[i]).clone();
    }
  }
  std::vector<std::pair<std::string, at::Tensor>> state;
  for (const auto& item : module_->named_parameters()) {
    const auto found = whole.find(item.value().unsafeGetTensorImpl());
    state.push_back({item.key(), found != whole.end() ? found->second : item.value().detach().clone()});
  }
  for (const auto& item : module_->named_buffers()) {
    if (item.value().defined()) state.push_back({item.key(), item.value().detach().clone()});
  }
  return state;
}

std::vector<std::pair<size_t, size_t>> FullyShardedDataParallelBase::located(
    const std::vector<at::Tensor>& parameters) const {
  std::unordered_map<const void*, std::pair<size_t, size_t>> where;
  for (size_t u = 0; u < units_.size(); ++u) {
    for (size_t i = 0; i < units_[u]->params.size(); ++i) where[units_[u]->params[i].unsafeGetTensorImpl()] = {u, i};
  }
  std::vector<std::pair<size_t, size_t>> out;
  for (const auto& p : parameters) {
    const auto found = where.find(p.unsafeGetTensorImpl());
    out.push_back(found != where.end() ? found->second : std::make_pair(SIZE_MAX, size_t{0}));
  }
  return out;
}

std::vector<at::Tensor> FullyShardedDataParallelBase::gather_pieces(const std::vector<at::Tensor>& pieces) {
  if (!error_.empty()) throw DistributedError(error_);
  settle();  // the training thread's collectives do not overtake queued ones
  torch::NoGradGuard no_grad;
  const auto params = parameters();
  LOCKSTEP_CHECK(pieces.size() == params.size(), UsageError, "FullyShardedDataParallel::gather_pieces: ", pieces.size(),
                 " pieces for ", params.size(), " parameters.");
  const auto where = located(params);
  std::vector<at::Tensor> whole(params.size());
  for (size_t u = 0; u < units_.size(); ++u) {
    const auto& unit = *units_[u];
    auto shard = at::zeros({unit.layout.shard_numel}, unit.shard.options());
    for (size_t k = 0; k < params.size(); ++k) {
      if (where[k].first != u || !pieces[k].defined()) continue;
      const auto piece = unit.layout.piece(where[k].second, shard_group_->rank());
      LOCKSTEP_CHECK(pieces[k].numel() == piece.numel, UsageError, "FullyShardedDataParallel::gather_pieces: piece ", k,
                     " has ", pieces[k].numel(), " elements where this rank's piece of '", unit.names[where[k].second],
                     "' has ", piece.numel, ".");
      shard.narrow(0, piece.shard_offset, piece.numel).copy_(pieces[k].reshape({-1}));
    }
    auto flat = at::empty({unit.layout.padded_numel()}, shard.options());
    transport_->all_gather(shard, flat, "all_gather of unit '" + unit.name + "''s optimizer state");
    for (size_t k = 0; k < params.size(); ++k) {
      if (where[k].first != u || !pieces[k].defined()) continue;
      const size_t i = where[k].second;
      whole[k] = flat.narrow(0, unit.layout.offsets[i], unit.layout.numels[i])
                     .view(unit.layout.shapes[i])
                     .to(pieces[k].dtype())
                     .clone();
    }
  }
  for (size_t k = 0; k < params.size(); ++k) {
    if (where[k].first == SIZE_MAX && pieces[k].defined()) whole[k] = pieces[k].clone();
  }
  return whole;
}

at::Tensor FullyShardedDataParallelBase::piece_of(const at::Tensor& parameter, const at::Tensor& whole) const {
  const auto where = located({parameter}).front();
  if (where.first == SIZE_MAX) return whole;
  const auto& unit = *units_[where.first];
  const size_t i = where.second;
  LOCKSTEP_CHECK(whole.numel() == unit.layout.numels[i], UsageError, "FullyShardedDataParallel: a tensor of ",
                 whole.numel(), " elements for parameter '", unit.names[i], "', which has ", unit.layout.numels[i], ".");
  const auto piece = unit.layout.piece(i, shard_group_->rank());
  return whole.reshape({-1}).narrow(0, piece.begin, piece.numel).clone();
}

void FullyShardedDataParallelBase::load_full_state_dict(const std::vector<std::pair<std::string, at::Tensor>>& state,
                                                        bool strict) {
  settle();  // no gather in flight into the units being loaded
  torch::NoGradGuard no_grad;
  std::unordered_map<std::string, at::Tensor> by_name(state.begin(), state.end());
  // The value for `name`, or undefined where a state that is not strict lacks it.
  const auto take = [&](const std::string& name, const at::Tensor& like) {
    const auto found = by_name.find(name);
    if (found == by_name.end() && !strict) return at::Tensor();
    LOCKSTEP_CHECK(found != by_name.end(), UsageError, "FullyShardedDataParallel: the state has no '", name, "'.");
    LOCKSTEP_CHECK(found->second.numel() == like.numel(), UsageError, "FullyShardedDataParallel: '", name, "' has ",
                   found->second.numel(), " elements in the state, ", like.numel(), " in the module.");
    return found->second;
  };
  const bool sharded = options_.sharding_strategy() != ShardingStrategy::no_shard;
  for (auto& unit : units_) {
    for (size_t i = 0; i < unit->params.size(); ++i) {
      const auto value = take(unit->names[i], unit->whole[i]);
      if (!value.defined()) continue;
      if (!sharded) {
        unit->whole[i].copy_(value.view_as(unit->whole[i]));
        continue;
      }
      const auto piece = unit->layout.piece(i, shard_group_->rank());
      unit->shard.narrow(0, piece.shard_offset, piece.numel).copy_(value.reshape({-1}).narrow(0, piece.begin, piece.numel));
    }
    if (sharded) {
      reshard(*unit);
      unit->gathered = false;  // the next forward gathers the new values
    }
  }
  for (const auto& item : module_->named_parameters()) {
    if (located({item.value()}).front().first != SIZE_MAX) continue;
    const auto value = take(item.key(), item.value());
    if (value.defined()) item.value().copy_(value.view_as(item.value()));
  }
  for (const auto& item : module_->named_buffers()) {
    const auto value = item.value().defined() ? take(item.key(), item.value()) : at::Tensor();
    if (value.defined()) item.value().copy_(value.view_as(item.value()));
  }
}

FullyShardedDataParallelBase::PieceInfo FullyShardedDataParallelBase::piece_info(const at::Tensor& parameter) const {
  const auto where = located({parameter}).front();
  PieceInfo info;
  if (where.first == SIZE_MAX || options_.sharding_strategy() == ShardingStrategy::no_shard) {
    for (const auto& p : parameters()) {
      if (p.unsafeGetTensorImpl() != parameter.unsafeGetTensorImpl()) continue;
      info.shape = where.first == SIZE_MAX ? p.sizes().vec() : units_[where.first]->layout.shapes[where.second];
      info.numel = c10::multiply_integers(info.shape);
      info.sharded = false;
      return info;
    }
    throw UsageError("FullyShardedDataParallel: a tensor that is none of the wrapped module's parameters.");
  }
  const auto& layout = units_[where.first]->layout;
  const auto piece = layout.piece(where.second, shard_group_->rank());
  info.shape = layout.shapes[where.second];
  info.begin = piece.begin;
  info.numel = piece.numel;
  return info;
}

at::Tensor FullyShardedDataParallelBase::local_piece(const at::Tensor& parameter) const {
  const auto info = piece_info(parameter);
  const auto where = located({parameter}).front();
  if (!info.sharded) {
    const auto& value = where.first == SIZE_MAX ? parameter : units_[where.first]->whole[where.second];
    return value.detach().reshape({-1}).clone();
  }
  return units_[where.first]->pieces[where.second].detach().clone();
}

void FullyShardedDataParallelBase::load_local_pieces(const std::map<std::string, at::Tensor>& pieces, bool strict) {
  settle();  // no gather in flight into the units being loaded
  torch::NoGradGuard no_grad;
  const auto take = [&](const std::string& name, int64_t numel) {
    const auto found = pieces.find(name);
    if (found == pieces.end() && !strict) return at::Tensor();
    LOCKSTEP_CHECK(found != pieces.end(), UsageError, "FullyShardedDataParallel: the state has no '", name, "'.");
    LOCKSTEP_CHECK(found->second.numel() == numel, UsageError, "FullyShardedDataParallel: '", name, "' has ",
                   found->second.numel(), " elements in the state where this rank's piece has ", numel, ".");
    return found->second.reshape({-1});
  };
  for (const auto& item : module_->named_parameters()) {
    const auto info = piece_info(item.value());
    const auto value = take(item.key(), info.numel);
    if (!value.defined()) continue;
    const auto where = located({item.value()}).front();
    if (where.first == SIZE_MAX) {
      item.value().copy_(value.view_as(item.value()));
    } else if (!info.sharded) {
      units_[where.first]->whole[where.second].copy_(value.view(info.shape));
    } else {
      units_[where.first]->pieces[where.second].copy_(value);
    }
  }
  if (options_.sharding_strategy() != ShardingStrategy::no_shard) {
    for (auto& unit : units_) {
      reshard(*unit);
      unit->gathered = false;  // the next forward gathers the new values
    }
  }
  for (const auto& item : module_->named_buffers()) {
    const auto value = item.value().defined() ? take(item.key(), item.value().numel()) : at::Tensor();
    if (value.defined()) item.value().copy_(value.view_as(item.value()));
  }
}

void FullyShardedDataParallelBase::fail(const std::string& message) {
  error_ = message;
  throw DistributedError(message);
}

}  // namespace distributed
}  // namespace lockstep
