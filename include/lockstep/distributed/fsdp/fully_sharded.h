#pragma once
/// FullyShardedDataParallel: sharded data-parallel training of a LibTorch module (PyTorch's FSDP
/// and ZeroRedundancyOptimizer in one engine): each rank keeps a 1/N shard of the parameters,
/// gradients and optimizer state, as ShardingOptions::sharding_strategy says.

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <lockstep/distributed/fsdp/flat_layout.h>
#include <lockstep/distributed/fsdp/sharding_options.h>
#include <lockstep/distributed/process_group.h>
#include <lockstep/distributed/wrapped_parameters.h>

namespace lockstep {
namespace distributed {
namespace detail {
class CommContext;
class ForwardOrder;
class ReplacedChild;
class ShardedUnit;
struct ShardingPlan;
}  // namespace detail

/// The module-type-independent part of FullyShardedDataParallel.
///
/// The parameters keep their identity: an optimizer made from `parameters()` after wrapping
/// steps them as usual. Between a backward and the next forward each parameter holds only this
/// rank's piece of its flattened elements (a 1-D tensor, possibly empty), and its gradient the
/// matching piece of the mean over the ranks, so the optimizer's state is a shard too. That is
/// right for every optimizer that steps element by element (SGD, Adam, AdamW, Adagrad, RMSprop);
/// not for LBFGS, which needs whole gradients (the strategies refuse it). After destruction the
/// parameters still hold this rank's pieces: take full_state_dict() first to keep them whole.
class FullyShardedDataParallelBase {
 public:
  /// Checks that every rank holds the same parameters, broadcasts rank 0's parameters and
  /// buffers, splits the module into units (ShardingOptions::auto_wrap_min_params) and shards
  /// them. A collective; `group` must outlive this object.
  FullyShardedDataParallelBase(std::shared_ptr<torch::nn::Module> module, ProcessGroup& group,
                               ShardingOptions options);
  virtual ~FullyShardedDataParallelBase();
  FullyShardedDataParallelBase(const FullyShardedDataParallelBase&) = delete;
  FullyShardedDataParallelBase& operator=(const FullyShardedDataParallelBase&) = delete;

  /// Before the module's forward (forward() calls it): gathers the parameters the forward
  /// needs (the root unit; all units with SHARD_GRAD_OP and ZeRO-1). The next backward reduces
  /// into the gradients the optimizer sees: they accumulate until it zeroes them (also between
  /// a forward and its backward), as in one process; a parameter that no rank's backward
  /// reached keeps its gradient as it was (undefined after zero_grad(set_to_none)).
  /// Except with NO_SHARD, a collective: every rank must make the same forwards, and one in a
  /// training forward while another evaluates fails here on both (DistributedError). Refuses
  /// (UsageError) a parameter registered on the module after it was wrapped, naming it.
  void prepare_forward();

  /// The total norm of the gradients over all ranks (as torch::nn::utils::clip_grad_norm_ of the
  /// whole model), scaling them down so that it is at most `max_norm`. A collective; call it
  /// between backward and the optimizer step. Returns the norm before clipping.
  double clip_grad_norm(double max_norm, double norm_type = 2.0);

  /// Every parameter and buffer by name, whole, on every rank (a collective): for checkpoints and
  /// for comparing with an unsharded run.
  std::vector<std::pair<std::string, at::Tensor>> full_state_dict();
  /// As full_state_dict(), but this rank keeps only the tensors whose names `wanted` accepts:
  /// each unit is gathered in turn and the rest dropped, so a rank holds its share and one unit.
  std::vector<std::pair<std::string, at::Tensor>> full_state_dict(const std::function<bool(const std::string&)>& wanted);

  /// Whole tensors from pieces laid out like the parameters' (a collective): `pieces[k]` is this
  /// rank's piece of a tensor shaped like parameter k of parameters(), such as Adam's exp_avg, or
  /// undefined where there is none (a parameter no optimizer stepped; gathered as zeros, returned
  /// undefined); returns the whole tensors, shaped like the parameters. For optimizer state in
  /// checkpoints. Pieces are sized as piece_info() says, whatever the parameters show now.
  std::vector<at::Tensor> gather_pieces(const std::vector<at::Tensor>& pieces);
  /// This rank's piece of `whole`, a tensor shaped like `parameter` (one of parameters()), such
  /// as a checkpoint's exp_avg for it; `whole` itself for a parameter that is not sharded.
  at::Tensor piece_of(const at::Tensor& parameter, const at::Tensor& whole) const;
  /// Loads whole parameters (by name, as full_state_dict() gives them) into this rank's shards,
  /// and buffers as they are. Throws UsageError naming a size that differs, and with `strict` a
  /// name the state lacks (without it, those keep their values).
  void load_full_state_dict(const std::vector<std::pair<std::string, at::Tensor>>& state, bool strict = true);

  /// Where this rank's piece of a parameter lies in the whole one (for sharded checkpoints).
  struct PieceInfo {
    /// The whole parameter's shape.
    std::vector<int64_t> shape;
    /// The piece: elements [begin, begin + numel) of the flattened whole (numel may be 0).
    int64_t begin = 0;
    int64_t numel = 0;
    /// false: every rank holds the parameter whole (NO_SHARD, or one outside every unit).
    bool sharded = true;
  };
  /// Where this rank's piece of `parameter` (one of parameters()) lies; UsageError for another tensor.
  PieceInfo piece_info(const at::Tensor& parameter) const;
  /// This rank's piece of `parameter`'s current values, 1-D (the whole, flattened, where
  /// piece_info says it is not sharded), sharing their memory as PyTorch's state_dict() does:
  /// clone it to keep values past the next step. No collective.
  at::Tensor local_piece(const at::Tensor& parameter) const;
  /// Loads this rank's pieces of the parameters by name (as local_piece gives them) and buffers
  /// whole; no collective. Throws UsageError naming a piece whose size differs from piece_info's,
  /// and with `strict` a parameter or buffer the state lacks (without it, those keep their values).
  void load_local_pieces(const std::map<std::string, at::Tensor>& pieces, bool strict = true);

  /// Time in the engine's collectives since construction or reset_comm_times(), and how much of
  /// it the training thread waited for. They run on a thread of their own: FULL_SHARD gathers the
  /// next unit (in the order of the first forward) while this one computes, in forward and in
  /// backward, and gradients are reduced while backward goes on.
  struct CommTimes {
    int64_t all_gathers = 0;         // gathers of a unit's parameters for forward and backward
    double all_gather_s = 0;
    double all_gather_waited_s = 0;  // of which the training thread waited
    /// Bytes gathered into fresh memory; the rest went into memory a unit resharded in forward
    /// handed over (FULL_SHARD and HYBRID_SHARD on the CPU, to a unit of the same size).
    int64_t all_gather_fresh_bytes = 0;
    double reduce_s = 0;             // reduce-scatters (all-reduces with NO_SHARD and ZeRO-1)
    double reduce_waited_s = 0;      // of which the end of backward waited
    /// 1 - waited / total: the share of all-gather time hidden behind compute (0 with no gathers).
    double all_gather_hidden_share() const;
  };
  CommTimes comm_times() const;
  void reset_comm_times();

  /// The wrapped module, type-erased.
  const std::shared_ptr<torch::nn::Module>& base_module() const { return module_; }
  /// The module's parameters (for the optimizer).
  std::vector<at::Tensor> parameters() const { return module_->parameters(); }
  ProcessGroup& group() const { return group_; }
  /// The ranks that shard the parameters among them: group(), or with HYBRID_SHARD this rank's
  /// group of ShardingOptions::hybrid_shard_size ranks.
  ProcessGroup& shard_group() const;
  const ShardingOptions& options() const { return options_; }
  /// How many units the module was split into (1: only the root).
  size_t unit_count() const;
  /// Why reduce-scatters and all-gathers do not go through shared memory ("" when they do).
  const std::string& why_not_shared_memory() const { return why_not_shared_memory_; }
  /// The layout of unit `index` (0 is the root).
  const FlatLayout& layout(size_t index) const;

  /// For the unit wrappers (detail): around a child unit's forward.
  void before_unit_forward(size_t unit);
  void after_unit_forward(size_t unit, const at::Tensor& output);

 private:
  void build_units();
  /// Waits for everything on the communication thread (before collectives of the training thread).
  void drain();
  void check_every_rank_forwards(bool training);
  void begin_backward();
  void before_gradient(size_t unit, size_t k);
  void on_gradient(size_t unit, size_t k);
  void reduce_ready_units();
  void finalize_backward();
  /// For each parameter of the units, in order: whether any rank's backward gave it a gradient
  /// (a collective).
  std::vector<bool> used_on_any_rank();
  /// Where each of parameters() is: (unit, index in unit), or unit SIZE_MAX for one not sharded.
  std::vector<std::pair<size_t, size_t>> located(const std::vector<at::Tensor>& parameters) const;

  std::shared_ptr<torch::nn::Module> module_;
  ProcessGroup& group_;
  ShardingOptions options_;
  std::unique_ptr<const detail::ShardingPlan> plan_;  // what options_.sharding_strategy() means
  std::shared_ptr<ProcessGroup> own_shard_group_;  // HYBRID_SHARD: this rank's group
  std::shared_ptr<ProcessGroup> replica_group_;    // HYBRID_SHARD: the ranks holding the same shards
  std::unique_ptr<detail::CommContext> comm_;
  std::vector<std::unique_ptr<detail::ShardedUnit>> units_;  // 0 is the root unit
  std::vector<std::unique_ptr<detail::ReplacedChild>> replaced_;
  std::unique_ptr<detail::ForwardOrder> order_;
  size_t next_reduced_ = 0;  // units_ reduced in this backward, in order_'s reduce order
  bool in_backward_ = false;
  bool forward_prepared_ = false;  // a training forward went through the wrapper
  std::string why_not_shared_memory_;
  WrappedParameters wrapped_;  // refuses parameters registered after wrapping
};

/// Sharded data-parallel training of a module of type `ModuleType` (the Impl class, or
/// torch::nn::Module). forward() runs the module's own forward; backward and the optimizer step
/// stay as in one process:
///
///   auto net = std::make_shared<NetImpl>();
///   FullyShardedDataParallel fsdp(net, *group, ShardingOptions().auto_wrap_min_params(100000));
///   torch::optim::Adam opt(fsdp.parameters(), 1e-3);  // after wrapping: shards
///   auto loss = torch::mse_loss(fsdp.forward(x), y);
///   opt.zero_grad();
///   loss.backward();  // gradients reduce-scattered, unit by unit
///   fsdp.clip_grad_norm(1.0);  // optional
///   opt.step();       // each rank steps its shard
///
/// Every rank must construct it and run the same forwards and backwards, in the same order.
template <typename ModuleType>
class FullyShardedDataParallel : public FullyShardedDataParallelBase {
 public:
  FullyShardedDataParallel(std::shared_ptr<ModuleType> module, ProcessGroup& group, ShardingOptions options = {})
      : FullyShardedDataParallelBase(module, group, std::move(options)), typed_(std::move(module)) {}
  FullyShardedDataParallel(const torch::nn::ModuleHolder<ModuleType>& module, ProcessGroup& group,
                           ShardingOptions options = {})
      : FullyShardedDataParallel(module.ptr(), group, std::move(options)) {}

  template <typename... Args>
  auto forward(Args&&... args) -> decltype(std::declval<ModuleType&>().forward(std::forward<Args>(args)...)) {
    prepare_forward();
    return typed_->forward(std::forward<Args>(args)...);
  }
  template <typename... Args>
  auto operator()(Args&&... args) -> decltype(std::declval<ModuleType&>().forward(std::forward<Args>(args)...)) {
    return forward(std::forward<Args>(args)...);
  }

  const std::shared_ptr<ModuleType>& module() const { return typed_; }

 private:
  std::shared_ptr<ModuleType> typed_;
};

template <typename ModuleType>
FullyShardedDataParallel(std::shared_ptr<ModuleType>, ProcessGroup&, ShardingOptions = {})
    -> FullyShardedDataParallel<ModuleType>;
template <typename ModuleType>
FullyShardedDataParallel(torch::nn::ModuleHolder<ModuleType>, ProcessGroup&, ShardingOptions = {})
    -> FullyShardedDataParallel<ModuleType>;

}  // namespace distributed
}  // namespace lockstep
