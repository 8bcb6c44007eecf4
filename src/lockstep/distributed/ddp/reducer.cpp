#include <lockstep/distributed/ddp/reducer.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <iostream>
#include <set>
#include <sstream>
#include <stdexcept>
#include <unordered_set>

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/torch.h>

#include <lockstep/core/error.h>
#include <lockstep/distributed/bucket_assignment.h>
#include <lockstep/distributed/collectives.h>

namespace lockstep {
namespace distributed {
namespace {

using Clock = std::chrono::steady_clock;

int64_t megabytes_to_bytes(double mb) { return static_cast<int64_t>(mb * 1024.0 * 1024.0); }

std::string join(const std::vector<std::string>& names, size_t limit = 8) {
  std::string out;
  for (size_t k = 0; k < names.size() && k < limit; ++k) out += (k ? ", " : "") + names[k];
  if (names.size() > limit) out += ", ... (" + std::to_string(names.size() - limit) + " more)";
  return out;
}

// True if `grad` is exactly `view` (same memory, same shape): then gradients already land in the
// bucket and need no copy.
bool is_view_of(const at::Tensor& grad, const at::Tensor& view) {
  return grad.defined() && grad.data_ptr() == view.data_ptr() && grad.sizes() == view.sizes() &&
         grad.strides() == view.strides() && grad.scalar_type() == view.scalar_type();
}

// A tensor over `buffer`'s memory that autograd does not see as a view: the optimizer's
// zero_grad() calls detach_() on gradients, which autograd refuses for views.
at::Tensor alias_slice(const at::Tensor& buffer, int64_t offset, at::IntArrayRef sizes) {
  auto slice = at::empty({0}, buffer.options());
  slice.set_(buffer.storage(), buffer.storage_offset() + offset, sizes);
  return slice;
}

}  // namespace

struct Reducer::Bucket {
  std::vector<size_t> members;
  at::Tensor buffer;
  std::vector<at::Tensor> views;  // one per member, shaped like the parameter
  std::unique_ptr<GradBucket> grad_bucket;
  size_t pending = 0;
  c10::optional<BucketFuture> future;
  std::shared_ptr<std::atomic<int64_t>> reduced_at;  // ns after backward_start; 0: not yet
};

Reducer::Reducer(std::vector<at::Tensor> parameters, std::vector<std::string> names, ProcessGroup& group,
                 DDPOptions options, std::shared_ptr<GradientTransport> transport)
    : params_(std::move(parameters)),
      names_(std::move(names)),
      group_(group),
      options_(std::move(options)),
      transport_(std::move(transport)) {
  if (names_.size() != params_.size()) {
    throw UsageError("Reducer: " + std::to_string(params_.size()) + " parameters but " +
                                std::to_string(names_.size()) + " names.");
  }
  if (!options_.comm_hook()) throw UsageError("DDPOptions::comm_hook is empty; leave the default or pass a hook.");
  if (!transport_) throw UsageError("Reducer: no transport; pass choose_gradient_transport(...).");
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!params_[i].requires_grad() || !params_[i].is_leaf()) {
      throw UsageError("Reducer: parameter '" + names_[i] +
                                  "' is not a leaf tensor that requires grad; only those can be reduced.");
    }
  }
  ready_.assign(params_.size(), false);
  local_used_ = torch::zeros({static_cast<int64_t>(params_.size())}, torch::kInt32);
  build_buckets(assign_buckets(params_, reverse_order(params_.size()), megabytes_to_bytes(options_.first_bucket_mb()),
                               megabytes_to_bytes(options_.bucket_cap_mb())));
  for (size_t i = 0; i < params_.size(); ++i) {
    // The reducer holds the accumulator so that every forward's graph reaches this same node.
    auto accumulator = torch::autograd::impl::grad_accumulator(params_[i]);
    hook_keys_.push_back(accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [this, i](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
          autograd_hook(i);
          return outputs;
        })));
    accumulators_.push_back(std::move(accumulator));
  }
}

Reducer::~Reducer() {
  for (size_t i = 0; i < accumulators_.size(); ++i) accumulators_[i]->del_post_hook(hook_keys_[i]);
}

void Reducer::build_buckets(const std::vector<std::vector<size_t>>& assignment) {
  torch::NoGradGuard no_grad;
  // Gradients that are views of the current buckets; new buckets may reuse the old ones' memory
  // (shared memory does), so they are copied out first.
  std::vector<at::Tensor> kept(params_.size());
  if (options_.gradient_as_bucket_view()) {
    for (size_t i = 0; i < params_.size(); ++i) {
      const auto& grad = params_[i].grad();
      if (grad.defined()) kept[i] = grad.clone();
    }
  }
  std::vector<Bucket> buckets(assignment.size());
  locator_.assign(params_.size(), {0, 0});
  for (size_t b = 0; b < assignment.size(); ++b) {
    auto& bucket = buckets[b];
    bucket.members = assignment[b];
    int64_t total = 0;
    for (size_t i : bucket.members) total += params_[i].numel();
    const auto options = params_[bucket.members.front()].options();
    bucket.buffer = transport_->allocate(b, total, options);
    int64_t offset = 0;
    for (size_t k = 0; k < bucket.members.size(); ++k) {
      const size_t i = bucket.members[k];
      const int64_t n = params_[i].numel();
      bucket.views.push_back(alias_slice(bucket.buffer, offset, params_[i].sizes()));
      offset += n;
      locator_[i] = {b, k};
      // Rebuilt buckets keep the gradients that views of the old ones held.
      if (kept[i].defined()) {
        bucket.views.back().copy_(kept[i]);
        params_[i].mutable_grad() = bucket.views.back();
      }
    }
  }
  buckets_ = std::move(buckets);
  for (size_t b = 0; b < buckets_.size(); ++b) buckets_[b].grad_bucket = make_grad_bucket(b, buckets_[b].buffer);
}

std::unique_ptr<GradBucket> Reducer::make_grad_bucket(size_t b, const at::Tensor& buffer) const {
  const auto& bucket = buckets_[b];
  std::vector<at::Tensor> params, views;
  std::vector<std::string> names;
  int64_t offset = 0;
  for (size_t i : bucket.members) {
    params.push_back(params_[i]);
    names.push_back(names_[i]);
    views.push_back(alias_slice(buffer, offset, params_[i].sizes()));
    offset += params_[i].numel();
  }
  auto grad_bucket = std::make_unique<GradBucket>(b, b + 1 == buckets_.size(), buffer, std::move(params),
                                                  std::move(names), std::move(views));
  grad_bucket->set_transport(transport_);
  return grad_bucket;
}

void Reducer::set_contributing_ranks(int ranks) {
  std::lock_guard<std::mutex> lock(mutex_);
  contributing_ranks_ = ranks;
}

void Reducer::join_backward() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!failure_.empty()) throw DistributedError(failure_);
  track_usage_ = searches_usage();
  // Through shared memory the shadow passes through this rank's own slot, where its buckets (and
  // with gradient_as_bucket_view its .grad) live: keep them as the Gloo path does.
  std::vector<at::Tensor> kept;
  if (transport_->reduces_through_bucket_memory()) {
    for (const auto& bucket : buckets_) kept.push_back(bucket.buffer.clone());
  }
  std::vector<BucketFuture> futures;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    // Zeros, not this rank's stale gradients: a joined rank contributes nothing.
    const auto shadow = make_grad_bucket(b, torch::zeros_like(buckets_[b].buffer));
    try {
      futures.push_back(options_.comm_hook()(group_, *shadow));
    } catch (const std::exception& e) {
      fail(group_.describe() + ": the comm hook failed to start the joined rank's reduction of " + bucket_name(b) +
           ": " + message_of(e));
    }
  }
  if (track_usage_) {
    local_used_.zero_();
    start_usage_allreduce();
  }
  for (size_t b = 0; b < futures.size(); ++b) {
    try {
      futures[b].wait(group_.timeout());
    } catch (const std::exception& e) {
      fail(group_.describe() + " (joined, shadowing): allreduce of " + bucket_name(b) + " did not complete: " +
           message_of(e));
    }
  }
  if (track_usage_) {
    finish_usage_allreduce(group_.describe() + " (joined, shadowing)");
    local_used_.zero_();  // it now holds the others' map: the next window starts empty
    static_usage_known_ = options_.static_graph();
  }
  torch::NoGradGuard no_grad;
  for (size_t b = 0; b < kept.size(); ++b) buckets_[b].buffer.copy_(kept[b]);
  finish_step();
}

void Reducer::finish_step() {
  ++steps_;
  const bool may_rebuild = options_.static_graph() || !options_.find_unused_parameters();
  if (steps_ == 1 && !has_rebuilt_ && may_rebuild) rebuild_pending_ = true;
}

void Reducer::prepare_for_forward() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!failure_.empty()) {
    throw DistributedError("Expected to have finished reduction in the prior iteration before starting a new one. " +
                           failure_);
  }
  if (backward_started_) {
    fail(group_.describe() + ": a backward pass started reducing gradients but did not finish (an error "
         "interrupted it), so the ranks' collectives are out of step; this DistributedDataParallel "
         "cannot be used further. Find the first error on any rank.");
  }
  every_backward_ = false;
  // As in PyTorch, only forwards that build a graph rebuild (a collective): evaluating under
  // NoGradGuard on one rank alone must not wait for the others.
  if (rebuild_pending_ && at::GradMode::is_enabled()) rebuild_buckets();
}

void Reducer::prepare_for_backward(const std::vector<at::Tensor>& outputs, bool sync, bool outputs_known) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!failure_.empty()) throw DistributedError(failure_);
  if (!sync) {
    expect_hooks_ = false;
    synchronised_backward_done_ = false;
    local_window_ = true;
    return;
  }
  if (at::GradMode::is_enabled()) arm(outputs_known ? &outputs : nullptr);
}

void Reducer::sync_every_backward(bool sync) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!failure_.empty()) throw DistributedError(failure_);
  every_backward_ = sync;
  if (sync) {
    arm(nullptr);
    return;
  }
  expect_hooks_ = false;
  synchronised_backward_done_ = false;
  local_window_ = true;
}

void Reducer::arm(const std::vector<at::Tensor>* outputs) {
  expect_hooks_ = true;
  synchronised_backward_done_ = false;
  local_window_ = false;
  std::fill(ready_.begin(), ready_.end(), false);
  for (auto& bucket : buckets_) {
    bucket.pending = bucket.members.size();
    bucket.future.reset();
  }
  next_to_launch_ = 0;
  used_work_.reset();
  track_usage_ = searches_usage();
  usage_at_end_ = track_usage_ && !outputs;
  // Otherwise unused_ keeps what static_graph found in its first iteration.
  if (usage_at_end_) unused_.clear();
  if (track_usage_ && outputs) find_unused(*outputs);
}

bool Reducer::searches_usage() const {
  return (options_.find_unused_parameters() || options_.static_graph()) && !static_usage_known_;
}

void Reducer::refuse_second_backward(size_t index) {
  fail(group_.describe() + ": parameter '" + names_[index] +
       "' received a gradient after this iteration's gradients were already reduced, with no forward through "
       "the DistributedDataParallel wrapper since: a second backward through the same forward (backward with "
       "retain_graph, then backward again), or a forward that called the module itself (net->forward(x)) "
       "instead of its wrapper (ddp(x), or the module Fabric's setup returned). Its gradients would stay "
       "local and the replicas would drift apart. Run each forward through the wrapper, one backward per "
       "forward; to accumulate gradients over several backward passes, run all but the last under "
       "no_sync() (Fabric: no_backward_sync); a graph that is the same every iteration may use "
       "DDPOptions().static_graph(true).");
}

void Reducer::refuse_unarmed_backward(size_t index) {
  fail(group_.describe() + ": parameter '" + names_[index] +
       "' received a gradient in a backward that no forward through the DistributedDataParallel wrapper "
       "prepared: the module was called itself (net->forward(x)) instead of its wrapper (ddp(x), or "
       "the module Fabric's setup returned). Its gradients would stay local and the replicas would drift "
       "apart. Call the wrapper for every training forward; to accumulate gradients locally, use no_sync() "
       "(Fabric: no_backward_sync).");
}

std::unordered_set<const torch::autograd::Node*> autograd_nodes_reached_by(const std::vector<at::Tensor>& outputs) {
  using torch::autograd::Node;
  std::unordered_set<const Node*> seen;
  std::vector<Node*> stack;
  for (const auto& out : outputs) {
    if (!out.defined() || !out.requires_grad()) continue;
    if (auto fn = out.grad_fn()) {
      stack.push_back(fn.get());
    } else if (auto accumulator = torch::autograd::impl::try_get_grad_accumulator(out)) {
      stack.push_back(accumulator.get());
    }
  }
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    if (!seen.insert(node).second) continue;
    for (const auto& edge : node->next_edges()) {
      if (edge.function) stack.push_back(edge.function.get());
    }
  }
  return seen;
}

void Reducer::find_unused(const std::vector<at::Tensor>& outputs) {
  const auto seen = autograd_nodes_reached_by(outputs);
  unused_.clear();
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!seen.count(accumulators_[i].get())) unused_.push_back(i);
  }
}

void Reducer::autograd_hook(size_t index) {
  std::lock_guard<std::mutex> lock(mutex_);
  // Used once in the accumulation window (no_sync micro-steps included) counts as used, as in
  // PyTorch; the map is cleared when the window's synchronised backward ends.
  if (searches_usage()) local_used_.data_ptr<int32_t>()[index] = 1;
  if (!expect_hooks_) {
    if (synchronised_backward_done_) refuse_second_backward(index);
    if (!local_window_) refuse_unarmed_backward(index);
    return;
  }
  if (!backward_started_) start_backward();
  if (ready_[index]) {
    fail(group_.describe() + ": parameter '" + names_[index] +
         "' received its gradient twice in one synchronised backward pass (a second backward through the "
         "same graph, or a parameter found unused that still got a gradient). Run one backward per forward, "
         "or accumulate under no_sync().");
  }
  if (steps_ == 0) arrival_order_.push_back(index);
  mark_ready(index);
}

void Reducer::start_backward() {
  backward_started_ = true;
  trace_ = ReducerTrace();
  trace_.step = steps_ + 1;
  trace_.backward_start = Clock::now();
  trace_.buckets.resize(buckets_.size());
  for (size_t b = 0; b < buckets_.size(); ++b) {
    trace_.buckets[b].index = b;
    trace_.buckets[b].parameters = buckets_[b].members.size();
    trace_.buckets[b].bytes = buckets_[b].buffer.numel() * buckets_[b].buffer.element_size();
  }
  torch::autograd::Engine::get_default_engine().queue_callback([this] { finalize_backward(); });
  for (size_t i : unused_) mark_ready(i);
}

void Reducer::mark_ready(size_t index) {
  ready_[index] = true;
  auto& bucket = buckets_[locator_[index].first];
  copy_grad_to_bucket(index, bucket.views[locator_[index].second]);
  if (--bucket.pending > 0) return;
  trace_.buckets[locator_[index].first].ready = since_start();
  launch_ready_buckets();
}

void Reducer::copy_grad_to_bucket(size_t index, const at::Tensor& view) {
  torch::NoGradGuard no_grad;
  auto& grad = params_[index].mutable_grad();
  if (!grad.defined()) {
    view.zero_();
    return;
  }
  if (!options_.gradient_as_bucket_view()) {
    view.copy_(grad);
    return;
  }
  if (is_view_of(grad, view)) return;
  // First step, or the optimizer set the grad to none: from now on it lives in the bucket.
  view.copy_(grad);
  grad = view;
}

void Reducer::launch_ready_buckets() {
  // Buckets start in index order on every rank, so the ranks' collectives pair up.
  while (next_to_launch_ < buckets_.size() && buckets_[next_to_launch_].pending == 0) launch(next_to_launch_++);
  if (track_usage_ && next_to_launch_ == buckets_.size() && !used_work_) start_usage_allreduce();
}

void Reducer::start_usage_allreduce() {
  // The hooks write the map on the CPU; NCCL reduces a copy on the group's device.
  used_on_device_ = group_.device().is_cuda() ? local_used_.to(group_.device()) : local_used_;
  std::vector<at::Tensor> tensors{used_on_device_};
  c10d::AllreduceOptions options;
  options.timeout = group_.timeout();
  used_work_ = group_.backend()->allreduce(tensors, options);
}

void Reducer::finish_usage_allreduce(const std::string& who) {
  try {
    used_work_->wait(group_.timeout());
  } catch (const std::exception& e) {
    fail(who + ": allreduce of the map of used parameters did not complete: " + message_of(e));
  }
  used_work_.reset();
  if (!used_on_device_.is_same(local_used_)) local_used_.copy_(used_on_device_);
  used_on_device_ = at::Tensor();
}

void Reducer::launch(size_t b) {
  auto& bucket = buckets_[b];
  trace_.buckets[b].launched = since_start();
  try {
    bucket.future.emplace(options_.comm_hook()(group_, *bucket.grad_bucket));
  } catch (const std::exception& e) {
    fail(group_.describe() + ": the comm hook failed to start reducing " + bucket_name(b) + ": " + message_of(e));
  }
  trace_.buckets[b].reduced_in_hook = bucket.future->completed();
  auto reduced_at = std::make_shared<std::atomic<int64_t>>(0);
  bucket.reduced_at = reduced_at;
  const auto start = trace_.backward_start;
  try {
    bucket.future->on_completion([reduced_at, start] {
      reduced_at->store(std::max<int64_t>(1, std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count()));
    });
  } catch (const std::exception&) {
    // A backend without futures: the trace falls back to the time the wait returned.
  }
}

void Reducer::finalize_backward() {
  std::lock_guard<std::mutex> lock(mutex_);
  trace_.backward_end = since_start();
  expect_hooks_ = false;
  if (usage_at_end_) mark_unused_at_end();
  if (next_to_launch_ < buckets_.size()) {
    std::vector<std::string> missing;
    for (size_t i = 0; i < params_.size(); ++i) {
      if (!ready_[i]) missing.push_back(names_[i]);
    }
    failure_ = group_.describe() + ": expected to have finished reduction in this backward pass, but parameters "
               "were not used in producing loss: " + join(missing, 20) +
               ". Use DDPOptions().find_unused_parameters(true) (with the Trainer: --strategy "
               "ddp_find_unused_parameters_true) if the forward skips them on purpose, or make sure "
               "all outputs of forward take part in calculating the loss.";
    transport_->leave();
    throw UnusedParametersError(failure_, std::move(missing));
  }
  for (size_t b = 0; b < buckets_.size(); ++b) wait_for_bucket(b);
  if (track_usage_) {
    finish_usage_allreduce(group_.describe());
    global_used_ = local_used_.clone();
    local_used_.zero_();  // the next accumulation window starts
    static_usage_known_ = options_.static_graph();
  }
  write_back();
  backward_started_ = false;
  synchronised_backward_done_ = true;
  trace_.finished = since_start();
  finish_step();
  if (every_backward_) arm(nullptr);
}

void Reducer::wait_for_bucket(size_t b) {
  auto& bucket = buckets_[b];
  at::Tensor reduced;
  try {
    reduced = bucket.future->wait(group_.timeout());
  } catch (const std::exception& e) {
    const auto unreachable = group_.unreachable_members();
    fail(group_.describe() + ": allreduce of " + bucket_name(b) + " did not complete: " + message_of(e) + "\n" +
         (unreachable.empty() ? "Every rank must run the same synchronised backward passes; check the other ranks' "
                                "output for an earlier error."
                              : "Unreachable: " + unreachable + "."));
  }
  bucket.future.reset();
  if (reduced.defined() && !is_view_of(reduced, bucket.buffer)) {
    if (reduced.numel() != bucket.buffer.numel()) {
      fail(group_.describe() + ": the comm hook returned " + std::to_string(reduced.numel()) + " values for " +
           bucket_name(b) + ", which holds " + std::to_string(bucket.buffer.numel()) + ".");
    }
    torch::NoGradGuard no_grad;
    bucket.buffer.copy_(reduced.reshape({-1}));
  }
  if (contributing_ranks_ > 0 && contributing_ranks_ != group_.world_size()) {
    // The hook averaged over the world size; joined ranks sent zeros (Join without
    // divide_by_initial_world_size).
    torch::NoGradGuard no_grad;
    bucket.buffer.mul_(static_cast<double>(group_.world_size()) / contributing_ranks_);
  }
  const int64_t at = bucket.reduced_at ? bucket.reduced_at->load() : 0;
  trace_.buckets[b].reduced = at > 0 ? std::chrono::nanoseconds(at) : since_start();
}

void Reducer::mark_unused_at_end() {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (ready_[i]) continue;
    unused_.push_back(i);
    mark_ready(i);
  }
}

void Reducer::write_back() {
  torch::NoGradGuard no_grad;
  const int32_t* used = global_used_.defined() ? global_used_.data_ptr<int32_t>() : nullptr;
  for (auto& bucket : buckets_) {
    for (size_t k = 0; k < bucket.members.size(); ++k) {
      const size_t i = bucket.members[k];
      // A parameter no rank used keeps its gradient as it was (undefined), as in PyTorch.
      if (used && used[i] == 0) continue;
      auto& grad = params_[i].mutable_grad();
      const auto& view = bucket.views[k];
      if (options_.gradient_as_bucket_view()) {
        if (!grad.defined()) {
          grad = view;
        } else if (!is_view_of(grad, view)) {
          grad.copy_(view);
        }
        continue;
      }
      if (grad.defined()) {
        grad.copy_(view);
      } else {
        grad = view.clone();
      }
    }
  }
}

void Reducer::rebuild_buckets() {
  rebuild_pending_ = false;
  has_rebuilt_ = true;
  std::vector<bool> seen(params_.size(), false);
  std::vector<int64_t> order;
  for (size_t i : arrival_order_) {
    if (!seen[i]) order.push_back(static_cast<int64_t>(i));
    seen[i] = true;
  }
  for (size_t k = params_.size(); k-- > 0;) {
    if (!seen[k]) order.push_back(static_cast<int64_t>(k));
  }
  arrival_order_.clear();
  arrival_order_.shrink_to_fit();
  // Every rank must bucket alike; rank 0's arrival order wins.
  auto shared = torch::tensor(order, torch::kInt64);
  broadcast_tensor(group_, shared, 0, CollectiveOptions().tag("DDP bucket order"));
  const int64_t* received = shared.data_ptr<int64_t>();
  const std::vector<size_t> final_order(received, received + shared.numel());
  auto assignment = assign_buckets(params_, final_order, megabytes_to_bytes(options_.first_bucket_mb()),
                                   megabytes_to_bytes(options_.bucket_cap_mb()));
  if (assignment != bucket_indices()) build_buckets(assignment);
}

std::vector<std::vector<size_t>> Reducer::bucket_indices() const {
  std::vector<std::vector<size_t>> out;
  for (const auto& bucket : buckets_) out.push_back(bucket.members);
  return out;
}

std::vector<at::Tensor> Reducer::bucket_buffers() const {
  std::vector<at::Tensor> out;
  for (const auto& bucket : buckets_) out.push_back(bucket.buffer);
  return out;
}

std::vector<std::string> Reducer::unused_parameter_names() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> out;
  for (size_t i : unused_) out.push_back(names_[i]);
  return out;
}

std::string Reducer::bucket_name(size_t b) const {
  std::vector<std::string> names;
  for (size_t i : buckets_[b].members) names.push_back(names_[i]);
  return "bucket " + std::to_string(b) + " (params: " + join(names) + ")";
}

void Reducer::fail(const std::string& message) {
  failure_ = message;
  // Peers waiting in shared memory learn at once that this rank is out (Gloo peers at the timeout).
  transport_->leave();
  throw DistributedError(message);
}

std::chrono::nanoseconds Reducer::since_start() const {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - trace_.backward_start);
}

}  // namespace distributed
}  // namespace lockstep
