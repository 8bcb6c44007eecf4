#pragma once
// ShardedUnit: one unit of the sharded engine (FSDP2's FSDPParamGroup): its parameters flattened
// into one buffer and sharded over the shard group, with FSDP2's verbs that move it between its
// states (not installed).

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include <lockstep/distributed/fsdp/flat_layout.h>
#include <lockstep/distributed/fsdp/sharding_options.h>

#include "comm_context.h"
#include "comm_thread.h"
#include "gradient_hooks.h"
#include "sharding_plan.h"

namespace lockstep {
namespace distributed {
namespace detail {

/// One parameter of a unit and its views (FSDP2's FSDPParam).
struct ShardedParameter {
  std::string name;
  at::Tensor param;      // the module's parameter: it points at `whole` or at `piece`
  at::Tensor whole;      // its whole value, in the unit's gathered buffer
  at::Tensor piece;      // this rank's piece of it, in the unit's shard (1-D, possibly empty)
  at::Tensor kept_grad;  // the gradient the optimizer sees: whole, or this rank's piece
  bool arrived = false;   // its gradient arrived in this backward
  bool had_grad = false;  // it had a gradient before this backward
};

class ShardedUnit {
 public:
  /// Where the whole parameters are. sharded: the gathered buffer is freed or out of date;
  /// unsharding: an all-gather into it is queued; unsharded: it holds the current values.
  enum class State { sharded, unsharding, unsharded };

  /// Flattens `members` (name, parameter), keeps this rank's shard and points the parameters at
  /// it. A child unit gathers in ShardingOptions::param_dtype. `before(k)` and `after(k)` run
  /// around the accumulation of parameter k's gradient. `first_index`: where its parameters
  /// start among the engine's (for finish_backward's flags).
  ShardedUnit(std::string name, const std::vector<std::pair<std::string, at::Tensor>>& members, bool child,
              const ShardingOptions& options, const ShardingPlan& plan, size_t first_index, CommContext& comm,
              const std::function<void(size_t)>& before, const std::function<void(size_t)>& after);

  const std::string& name() const { return name_; }
  const FlatLayout& layout() const { return layout_; }
  const std::vector<ShardedParameter>& parameters() const { return params_; }
  State state() const { return state_; }
  /// The gathered buffer's size.
  int64_t gathered_bytes() const { return layout_.padded_numel() * full_.element_size(); }

  // FSDP2's verbs.
  /// Queues the all-gather of the whole parameters on the communication thread, unless they are
  /// there or on their way.
  void unshard();
  /// Unshards if nobody did, waits for the gather, and points the parameters at the whole values.
  void wait_for_unshard();
  /// Points the parameters at this rank's pieces; where the plan says so, frees the whole ones
  /// (`hand_over`: their memory waits for the next gather, see GatherPool).
  void reshard(bool hand_over = false);
  /// Queues the reduction of this backward's gradients into the kept ones (a parameter that got
  /// none counts as zero), after resharding where the plan says so.
  void post_backward();

  // Backward's bookkeeping.
  void pre_backward();
  /// Before parameter k's first gradient of this backward: takes the gradient the optimizer left.
  void before_gradient(size_t k);
  /// Parameter k's gradient arrived; true once every parameter's has.
  bool gradient_arrived(size_t k);
  /// Every parameter's gradient arrived, or backward ended.
  bool ready() const { return pending_ == 0; }
  void backward_ended() { pending_ = 0; }
  /// After the reductions: each parameter shows its kept gradient, or none where no rank used it
  /// (`used_on_any_rank`, by the engine's parameter index) and it had none before.
  void finish_backward(const std::vector<bool>& used_on_any_rank);
  /// Everything queued on the communication thread is done.
  void drained();
  /// The shards changed (a step, a load; nothing queued): the next forward gathers again.
  void mark_stale();

  // State dicts.
  /// This rank's shard of the parameters (the gathered buffer's dtype may differ).
  const at::Tensor& shard() const { return shard_; }
  /// The gradients this rank holds: its shard of them (or all, under NO_SHARD).
  at::Tensor own_gradients() const;
  /// Every rank's `shard` (laid out like shard()) gathered into a flat buffer; a collective on
  /// the calling thread. `what` names it in errors.
  at::Tensor all_gather(const at::Tensor& shard, const std::string& what) const;
  /// Parameter k's part of a flat buffer laid out like the unit's, shaped like it.
  at::Tensor whole_of(size_t k, const at::Tensor& flat) const;
  /// Where this rank's piece of parameter k lies.
  FlatLayout::Piece piece(size_t k) const { return layout_.piece(k, rank_); }
  /// Loads parameter k's whole value: into this rank's piece, or whole under NO_SHARD.
  void load_whole(size_t k, const at::Tensor& value);
  /// Loads this rank's piece of parameter k (the whole, flattened, under NO_SHARD).
  void load_piece(size_t k, const at::Tensor& value);

 private:
  void wait_for_gather();
  void point_parameters_at(bool whole);
  void take_previous_gradient(size_t k);

  std::string name_;
  ShardingPlan plan_;
  std::optional<at::ScalarType> reduce_dtype_;
  CommContext& comm_;
  int rank_;
  size_t first_index_;
  FlatLayout layout_;
  std::vector<ShardedParameter> params_;
  at::Tensor full_;       // every rank's shard together: the whole parameters, padded
  at::Tensor shard_;      // this rank's part: a view into full_, or its own memory
  at::Tensor reduced_;    // the kept gradients: whole (NO_SHARD, ZeRO-1) or this rank's shard
  at::Tensor flat_grad_;  // whole gradients: this backward's, all-reduced from here
  State state_ = State::unsharded;
  CommThread::Ticket gathering_;  // the queued all-gather (unsharding)
  bool parameters_whole_ = true;  // the parameters point at their whole values
  size_t pending_ = 0;            // parameters whose gradient has not arrived in this backward
  GradientHooks hooks_;
};

}  // namespace detail
}  // namespace distributed
}  // namespace lockstep
