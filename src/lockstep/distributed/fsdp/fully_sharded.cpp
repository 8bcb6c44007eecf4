#include <lockstep/distributed/fsdp/fully_sharded.h>

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include <torch/csrc/autograd/engine.h>
#include <torch/torch.h>

#include <lockstep/core/error.h>
#include <lockstep/distributed/collectives.h>
#include <lockstep/distributed/module_state.h>

#include "comm_context.h"
#include "forward_order.h"
#include "hybrid_groups.h"
#include "replaced_child.h"
#include "sharded_unit.h"
#include "sharding_plan.h"
#include "wrap_policy.h"

namespace lockstep {
namespace distributed {
namespace {

using detail::ForwardOrder;

// The shared memory slot of each rank: larger units go through it in chunks. A slot the size of
// the largest unit would put world size x that unit in every rank's resident memory. 4 MiB: the
// 24.2M MLP's FULL_SHARD peaks 22 MB lower on 2 ranks and 50 MB on 4 than with 16, at the same
// steps/s (bench_fsdp, 2026-12-06).
constexpr int64_t kSharedMemorySlotBytes = 4 << 20;

void check_options(const ShardingOptions& options) {
  if (options.auto_wrap_min_params() < 0) {
    throw UsageError("ShardingOptions: auto_wrap_min_params must be 0 (one unit) or more (given " +
                     std::to_string(options.auto_wrap_min_params()) + ").");
  }
  if (options.hybrid_shard_size() != 0 && options.sharding_strategy() != ShardingStrategy::hybrid_shard) {
    throw UsageError("ShardingOptions: hybrid_shard_size " + std::to_string(options.hybrid_shard_size()) +
                     " is for HYBRID_SHARD, but the sharding is " + to_string(options.sharding_strategy()) +
                     ". Set sharding_strategy(ShardingStrategy::hybrid_shard), or drop it.");
  }
  for (const auto& [dtype, option] : {std::make_pair(options.param_dtype(), "param_dtype"),
                                      std::make_pair(options.reduce_dtype(), "reduce_dtype")}) {
    if (dtype && !at::isFloatingType(*dtype)) {
      throw UsageError(std::string("ShardingOptions: ") + option + " " + c10::toString(*dtype) +
                       " is not a floating dtype; give at::kBFloat16, at::kHalf or at::kFloat.");
    }
  }
  if (options.param_dtype() && (options.sharding_strategy() == ShardingStrategy::no_shard ||
                                options.sharding_strategy() == ShardingStrategy::shard_optimizer_state)) {
    throw UsageError("ShardingOptions: param_dtype needs parameters gathered before forward (FULL_SHARD, "
                     "HYBRID_SHARD or SHARD_GRAD_OP), but the sharding is " + to_string(options.sharding_strategy()) +
                     ". Change the sharding, or compute in low precision with autocast (--precision bf16-mixed).");
  }
}

// The parameters of each unit, by name: unit 0 (the root) holds every parameter that requires
// grad and is in no child unit; unit c + 1 those of children[c].
std::vector<std::vector<std::pair<std::string, at::Tensor>>> members_of_units(
    torch::nn::Module& module, const std::vector<detail::ChildUnit>& children) {
  std::unordered_map<const void*, size_t> unit_of;
  std::vector<std::vector<std::pair<std::string, at::Tensor>>> members(children.size() + 1);
  for (size_t c = 0; c < children.size(); ++c) {
    for (const auto& item : children[c].parent->ptr(children[c].index)->named_parameters()) {
      if (!item.value().requires_grad() || !unit_of.emplace(item.value().unsafeGetTensorImpl(), c + 1).second) continue;
      members[c + 1].push_back({children[c].name + "." + item.key(), item.value()});
    }
  }
  for (const auto& item : module.named_parameters()) {
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
  return members;
}

}  // namespace

FullyShardedDataParallelBase::FullyShardedDataParallelBase(std::shared_ptr<torch::nn::Module> module,
                                                           ProcessGroup& group, ShardingOptions options)
    : module_(std::move(module)),
      group_(group),
      options_(std::move(options)),
      plan_(std::make_unique<detail::ShardingPlan>(detail::ShardingPlan::of(options_.sharding_strategy()))) {
  if (!module_) throw UsageError("FullyShardedDataParallel: the module is null.");
  check_options(options_);
  verify_same_parameters(*module_, group_, "FullyShardedDataParallel");
  std::vector<at::Tensor> state;
  for (const auto& p : module_->parameters()) state.push_back(p);
  for (const auto& b : module_->buffers()) {
    if (b.defined()) state.push_back(b);
  }
  broadcast_tensors(group_, state, "FSDP parameters and buffers");
  if (options_.sharding_strategy() == ShardingStrategy::hybrid_shard) {
    auto groups = detail::make_hybrid_groups(group_, options_.hybrid_shard_size());
    own_shard_group_ = std::move(groups.shard);
    replica_group_ = std::move(groups.replica);
  }
  comm_ = std::make_unique<detail::CommContext>(group_, own_shard_group_ ? *own_shard_group_ : group_,
                                                replica_group_.get());
  build_units();
  std::vector<int64_t> sizes;
  for (const auto& unit : units_) sizes.push_back(unit->gathered_bytes());
  std::sort(sizes.rbegin(), sizes.rend());
  const int64_t largest = sizes.empty() ? 0 : sizes[0];
  // A bound on the memory handed over between gathers: the two largest units (the one in use and
  // the prefetch are all that forward gathers at once).
  comm_->gathered.set_limit(static_cast<size_t>(largest + (sizes.size() > 1 ? sizes[1] : 0)));
  comm_->transport = choose_shard_transport(comm_->shard_group, std::min(largest, kSharedMemorySlotBytes),
                                            options_.shared_memory(), &why_not_shared_memory_);
  order_ = std::make_unique<ForwardOrder>(units_.size());
  wrapped_ = WrappedParameters(*module_, "FullyShardedDataParallel");
}

FullyShardedDataParallelBase::~FullyShardedDataParallelBase() {
  if (comm_) comm_->thread.reset();  // finishes what is queued, while the units still exist
  replaced_.clear();
  units_.clear();
}

ProcessGroup& FullyShardedDataParallelBase::shard_group() const { return comm_->shard_group; }
size_t FullyShardedDataParallelBase::unit_count() const { return units_.size(); }
const FlatLayout& FullyShardedDataParallelBase::layout(size_t index) const { return units_.at(index)->layout(); }

void FullyShardedDataParallelBase::build_units() {
  const auto children = detail::find_units(*module_, options_);
  if (options_.param_dtype() && children.empty()) {
    throw UsageError("ShardingOptions: param_dtype " + std::string(c10::toString(*options_.param_dtype())) +
                     " applies to child units, and the module has none (the root unit keeps the parameters' "
                     "dtype). Make units with auto_wrap_min_params or auto_wrap_module_types.");
  }
  const auto members = members_of_units(*module_, children);
  size_t first_index = 0;
  for (size_t u = 0; u < members.size(); ++u) {
    units_.push_back(std::make_unique<detail::ShardedUnit>(
        u == 0 ? "" : children[u - 1].name, members[u], u > 0, options_, *plan_, first_index, *comm_,
        [this, u](size_t k) { before_gradient(u, k); }, [this, u](size_t k) { on_gradient(u, k); }));
    first_index += members[u].size();
    if (u > 0) replaced_.push_back(std::make_unique<detail::ReplacedChild>(this, u, children[u - 1]));
  }
}

void FullyShardedDataParallelBase::drain() {
  comm_->drain();
  for (auto& unit : units_) unit->drained();
}

void FullyShardedDataParallelBase::prepare_forward() {
  comm_->throw_if_failed();
  wrapped_.check(*module_);
  const bool training = torch::GradMode::is_enabled() && module_->is_training();
  if (training) forward_prepared_ = true;
  if (plan_->sharded) check_every_rank_forwards(training);
  units_.front()->wait_for_unshard();
  if (plan_->reshard_after_use) {
    if (order_->known() && order_->first() != ForwardOrder::none) units_[order_->first()]->unshard();
  } else {
    // Each child unit waits for its own gather before its forward (before_unit_forward).
    for (auto& unit : units_) unit->unshard();
  }
}

// A forward that only some ranks make would pair its gathers with another forward's on the other
// ranks and fail far from here, or hang. So the ranks first tell each other what forward they
// are in (one number each): a training forward on one rank and an evaluation on another are
// refused here, on both.
void FullyShardedDataParallelBase::check_every_rank_forwards(bool training) {
  auto& shards = comm_->shard_group;
  if (shards.world_size() == 1) return;
  const auto mine = at::full({1}, training ? 1.0f : 0.0f);
  auto all = at::empty({shards.world_size()}, at::kFloat);
  comm_->wait(comm_->thread->submit([this, mine, all]() mutable {
    comm_->transport->all_gather(mine, all, "all_gather of the kind of forward each rank is in");
  }),
              "the all_gather of the kind of forward");
  std::string others;
  const auto* kinds = all.data_ptr<float>();
  for (int r = 0; r < shards.world_size(); ++r) {
    if ((kinds[r] == 1.0f) != training) others += (others.empty() ? "" : ", ") + std::to_string(r);
  }
  if (others.empty()) return;
  const auto kind = [](bool train) {
    return std::string(train ? "a training forward" : "an evaluation forward (no grad, or eval())");
  };
  comm_->fail(group_.describe() + ": FullyShardedDataParallel: this rank is in " + kind(training) + " while rank(s) " +
              others + " of its shard group are in " + kind(!training) + ". Under " +
              to_string(options_.sharding_strategy()) +
              " every forward gathers parameters from every rank, so every rank must make the same forwards: evaluate "
              "on all ranks (the Trainer's validation does), or take full_state_dict() on all ranks and evaluate an "
              "unwrapped copy on one. NO_SHARD forwards need no other rank.");
}

void FullyShardedDataParallelBase::begin_backward() {
  if (!forward_prepared_) {
    comm_->fail(group_.describe() + ": FullyShardedDataParallel: a backward through a forward that did not go "
                "through the wrapper. Call forward() (or prepare_forward() before the module's own forward).");
  }
  for (auto& unit : units_) unit->pre_backward();
  next_reduced_ = 0;
  in_backward_ = true;
  torch::autograd::Engine::get_default_engine().queue_callback([this] { finalize_backward(); });
}

void FullyShardedDataParallelBase::before_gradient(size_t unit, size_t k) {
  if (!in_backward_) begin_backward();
  units_[unit]->before_gradient(k);
}

void FullyShardedDataParallelBase::on_gradient(size_t unit, size_t k) {
  if (units_[unit]->gradient_arrived(k)) reduce_ready_units();
}

void FullyShardedDataParallelBase::reduce_ready_units() {
  // In one order on every rank, whatever order the units' gradients complete in.
  const auto& order = order_->reduce_order();
  while (next_reduced_ < order.size() && units_[order[next_reduced_]]->ready()) {
    units_[order[next_reduced_++]]->post_backward();
  }
}

void FullyShardedDataParallelBase::finalize_backward() {
  // Units with parameters that got no gradient (not used by this forward) count them as zero.
  for (auto& unit : units_) unit->backward_ended();
  reduce_ready_units();
  const auto start = std::chrono::steady_clock::now();
  drain();
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  comm_->record([waited](CommTimes& times) { times.reduce_waited_s += waited; });
  if (!order_->known()) order_->learn();
  const auto used = used_on_any_rank();
  for (auto& unit : units_) unit->finish_backward(used);
  comm_->gathered.clear();  // nothing is gathered before the next forward
  in_backward_ = false;
  forward_prepared_ = false;
}

std::vector<bool> FullyShardedDataParallelBase::used_on_any_rank() {
  std::vector<int32_t> flags;
  for (const auto& unit : units_) {
    for (const auto& p : unit->parameters()) flags.push_back(p.arrived ? 1 : 0);
  }
  auto used = at::tensor(flags, at::kInt);
  if (group_.world_size() > 1 && !flags.empty()) {
    try {
      all_reduce(group_, used, ReduceOp::max, CollectiveOptions().tag("FSDP parameters used in backward"));
    } catch (const std::exception& e) {
      comm_->fail(e.what());
    }
  }
  const auto* any = used.data_ptr<int32_t>();
  return std::vector<bool>(any, any + flags.size());
}

void FullyShardedDataParallelBase::before_unit_forward(size_t unit) {
  if (forward_prepared_) order_->ran(unit);
  units_[unit]->wait_for_unshard();
  const auto next = order_->known() ? order_->next(unit) : ForwardOrder::none;
  if (plan_->reshard_after_use && next != ForwardOrder::none) {
    units_[next]->unshard();
  }
}

void FullyShardedDataParallelBase::after_unit_forward(size_t unit, const at::Tensor& output) {
  if (!plan_->reshard_after_use) return;
  // The last unit of forward is the first of backward: it stays gathered for it.
  const bool backward_next = output.requires_grad() && order_->known() && unit == order_->last();
  if (!backward_next) units_[unit]->reshard(true);
  if (!output.requires_grad()) return;
  // Backward reaches this output before anything that used the unit's parameters; the unit
  // before it in forward is gathered meanwhile.
  output.register_hook([this, unit](const at::Tensor&) {
    units_[unit]->wait_for_unshard();
    if (order_->previous(unit) != ForwardOrder::none) units_[order_->previous(unit)]->unshard();
  });
}

FullyShardedDataParallelBase::CommTimes FullyShardedDataParallelBase::comm_times() const { return comm_->times(); }

void FullyShardedDataParallelBase::reset_comm_times() { comm_->reset_times(); }

double FullyShardedDataParallelBase::CommTimes::all_gather_hidden_share() const {
  return all_gather_s > 0 ? std::max(0.0, 1.0 - all_gather_waited_s / all_gather_s) : 0.0;
}

double FullyShardedDataParallelBase::clip_grad_norm(double max_norm, double norm_type) {
  comm_->throw_if_failed();
  drain();  // the training thread's collectives do not overtake queued ones
  if (!(max_norm > 0) || !(norm_type > 0)) {
    throw UsageError("FullyShardedDataParallel::clip_grad_norm: max_norm and norm_type must be positive (given " +
                     std::to_string(max_norm) + " and " + std::to_string(norm_type) + ").");
  }
  torch::NoGradGuard no_grad;
  const bool infinite = std::isinf(norm_type);
  // This rank's part of every unit's gradients: each element of the model once over the ranks.
  std::vector<at::Tensor> parts;
  for (auto& unit : units_) parts.push_back(unit->own_gradients());
  auto local = at::zeros({1}, at::kDouble);
  for (const auto& part : parts) {
    if (part.numel() == 0) continue;
    const auto norm = part.abs().max().to(at::kDouble);
    local = infinite ? at::maximum(local, norm) : local + part.to(at::kDouble).abs().pow(norm_type).sum();
  }
  if (plan_->sharded) {
    // Over the ranks that shard: with HYBRID_SHARD the other groups hold the same gradients.
    all_reduce(comm_->shard_group, local, infinite ? ReduceOp::max : ReduceOp::sum,
               CollectiveOptions().tag("FSDP clip_grad_norm"));
  }
  const double total = infinite ? local.item<double>() : std::pow(local.item<double>(), 1.0 / norm_type);
  const double coefficient = max_norm / (total + 1e-6);
  if (coefficient < 1) {
    for (auto& part : parts) part.mul_(coefficient);
  }
  return total;
}

std::vector<std::pair<std::string, at::Tensor>> FullyShardedDataParallelBase::full_state_dict() {
  return full_state_dict([](const std::string&) { return true; });
}

std::vector<std::pair<std::string, at::Tensor>> FullyShardedDataParallelBase::full_state_dict(
    const std::function<bool(const std::string&)>& wanted) {
  comm_->throw_if_failed();
  drain();  // the training thread's collectives do not overtake queued ones
  torch::NoGradGuard no_grad;
  std::unordered_map<const void*, bool> kept;  // the parameters this rank keeps (a tied one: under any name)
  for (const auto& item : module_->named_parameters()) {
    bool& keep = kept[item.value().unsafeGetTensorImpl()];
    keep = keep || wanted(item.key());
  }
  std::unordered_map<const void*, at::Tensor> whole;
  for (auto& unit : units_) {
    const auto flat = unit->all_gather(unit->shard(), "parameters for a state dict");
    for (size_t k = 0; k < unit->parameters().size(); ++k) {
      const void* impl = unit->parameters()[k].param.unsafeGetTensorImpl();
      if (kept[impl]) whole[impl] = unit->whole_of(k, flat).clone();
    }
  }
  std::vector<std::pair<std::string, at::Tensor>> state;
  for (const auto& item : module_->named_parameters()) {
    if (!wanted(item.key())) continue;
    const auto found = whole.find(item.value().unsafeGetTensorImpl());
    state.push_back({item.key(), found != whole.end() ? found->second : item.value().detach().clone()});
  }
  for (const auto& item : module_->named_buffers()) {
    if (item.value().defined() && wanted(item.key())) state.push_back({item.key(), item.value().detach().clone()});
  }
  return state;
}

std::vector<std::pair<size_t, size_t>> FullyShardedDataParallelBase::located(
    const std::vector<at::Tensor>& parameters) const {
  std::unordered_map<const void*, std::pair<size_t, size_t>> where;
  for (size_t u = 0; u < units_.size(); ++u) {
    const auto& params = units_[u]->parameters();
    for (size_t k = 0; k < params.size(); ++k) where[params[k].param.unsafeGetTensorImpl()] = {u, k};
  }
  std::vector<std::pair<size_t, size_t>> out;
  for (const auto& p : parameters) {
    const auto found = where.find(p.unsafeGetTensorImpl());
    out.push_back(found != where.end() ? found->second : std::make_pair(SIZE_MAX, size_t{0}));
  }
  return out;
}

std::vector<at::Tensor> FullyShardedDataParallelBase::gather_pieces(const std::vector<at::Tensor>& pieces) {
  comm_->throw_if_failed();
  drain();  // the training thread's collectives do not overtake queued ones
  torch::NoGradGuard no_grad;
  const auto params = parameters();
  LOCKSTEP_CHECK(pieces.size() == params.size(), UsageError, "FullyShardedDataParallel::gather_pieces: ", pieces.size(),
                 " pieces for ", params.size(), " parameters.");
  const auto where = located(params);
  std::vector<at::Tensor> whole(params.size());
  for (size_t u = 0; u < units_.size(); ++u) {
    const auto& unit = *units_[u];
    auto shard = at::zeros({unit.layout().shard_numel}, unit.shard().options());
    for (size_t k = 0; k < params.size(); ++k) {
      if (where[k].first != u || !pieces[k].defined()) continue;
      const auto piece = unit.piece(where[k].second);
      LOCKSTEP_CHECK(pieces[k].numel() == piece.numel, UsageError, "FullyShardedDataParallel::gather_pieces: piece ", k,
                     " has ", pieces[k].numel(), " elements where this rank's piece of '",
                     unit.parameters()[where[k].second].name, "' has ", piece.numel, ".");
      shard.narrow(0, piece.shard_offset, piece.numel).copy_(pieces[k].reshape({-1}));
    }
    const auto flat = unit.all_gather(shard, "optimizer state");
    for (size_t k = 0; k < params.size(); ++k) {
      if (where[k].first == u && pieces[k].defined()) {
        whole[k] = unit.whole_of(where[k].second, flat).to(pieces[k].dtype()).clone();
      }
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
  const size_t k = where.second;
  LOCKSTEP_CHECK(whole.numel() == unit.layout().numels[k], UsageError, "FullyShardedDataParallel: a tensor of ",
                 whole.numel(), " elements for parameter '", unit.parameters()[k].name, "', which has ",
                 unit.layout().numels[k], ".");
  const auto piece = unit.piece(k);
  return whole.reshape({-1}).narrow(0, piece.begin, piece.numel).clone();
}

void FullyShardedDataParallelBase::load_full_state_dict(const std::vector<std::pair<std::string, at::Tensor>>& state,
                                                        bool strict) {
  drain();  // no gather in flight into the units being loaded
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
  for (auto& unit : units_) {
    for (size_t k = 0; k < unit->parameters().size(); ++k) {
      const auto value = take(unit->parameters()[k].name, unit->parameters()[k].whole);
      if (value.defined()) unit->load_whole(k, value);
    }
    unit->reshard();
    unit->mark_stale();  // the next forward gathers the new values
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
  if (where.first == SIZE_MAX || !plan_->sharded) {
    for (const auto& p : parameters()) {
      if (p.unsafeGetTensorImpl() != parameter.unsafeGetTensorImpl()) continue;
      info.shape = where.first == SIZE_MAX ? p.sizes().vec() : units_[where.first]->layout().shapes[where.second];
      info.numel = c10::multiply_integers(info.shape);
      info.sharded = false;
      return info;
    }
    throw UsageError("FullyShardedDataParallel: a tensor that is none of the wrapped module's parameters.");
  }
  const auto& unit = *units_[where.first];
  const auto piece = unit.piece(where.second);
  info.shape = unit.layout().shapes[where.second];
  info.begin = piece.begin;
  info.numel = piece.numel;
  return info;
}

at::Tensor FullyShardedDataParallelBase::local_piece(const at::Tensor& parameter) const {
  const auto info = piece_info(parameter);
  const auto where = located({parameter}).front();
  if (where.first == SIZE_MAX) return parameter.detach().reshape({-1});
  const auto& p = units_[where.first]->parameters()[where.second];
  return (info.sharded ? p.piece : p.whole).detach().reshape({-1});
}

void FullyShardedDataParallelBase::load_local_pieces(const std::map<std::string, at::Tensor>& pieces, bool strict) {
  drain();  // no gather in flight into the units being loaded
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
    const auto value = take(item.key(), piece_info(item.value()).numel);
    if (!value.defined()) continue;
    const auto where = located({item.value()}).front();
    if (where.first == SIZE_MAX) {
      item.value().copy_(value.view_as(item.value()));
    } else {
      units_[where.first]->load_piece(where.second, value);
    }
  }
  for (auto& unit : units_) {
    unit->reshard();
    unit->mark_stale();  // the next forward gathers the new values
  }
  for (const auto& item : module_->named_buffers()) {
    const auto value = item.value().defined() ? take(item.key(), item.value().numel()) : at::Tensor();
    if (value.defined()) item.value().copy_(value.view_as(item.value()));
  }
}

}  // namespace distributed
}  // namespace lockstep
