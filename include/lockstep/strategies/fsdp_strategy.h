#pragma once
/// FSDPStrategy (`--strategy fsdp`): sharded data parallel through FullyShardedDataParallel, as
/// Lightning's FSDPStrategy. Its settings are its constructor's: distributed::ShardingOptions (the
/// sharding, the units, mixed precision) and the StateDictType of the Trainer's checkpoints. The
/// registered names bind one sharding each: fsdp (FULL_SHARD), fsdp_shard_grad_op,
/// fsdp_shard_optimizer_state, fsdp_hybrid_shard and fsdp_no_shard; the --fsdp-* flags
/// (cli/trainer_flags.h) set the rest on the strategy their --strategy names.

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <lockstep/checkpoint/sharded_checkpoint.h>
#include <lockstep/distributed/fsdp/fully_sharded.h>
#include <lockstep/strategies/parallel_strategy.h>

namespace lockstep {
namespace strategies {

/// How FSDPStrategy saves the Trainer's checkpoints (Lightning's state_dict_type).
enum class StateDictType {
  /// Whole tensors gathered from every rank; rank 0 writes one file (Python, one process and DDP
  /// load it).
  full,
  /// A directory with each rank's pieces and metadata.json (checkpoint/sharded_checkpoint.h):
  /// nothing is gathered; it resumes on any world size, and one process or DDP loads it whole.
  sharded,
  /// The same pieces in torch.distributed.checkpoint's default format (checkpoint/dcp_checkpoint.h):
  /// `.metadata` and one `__<rank>_0.distcp` per rank, which Python's `dcp.load` reads on any
  /// world size (keys as get_state_dict names them: model.*, optim.*). One optimizer at most.
  dcp,
};

/// "full", "sharded" or "dcp" (case-insensitive); anything else throws UsageError listing them.
StateDictType parse_state_dict_type(const std::string& name);

/// Processes, launch and collectives as every ParallelStrategy (beside DDPStrategy); each module
/// set up is wrapped in its own FullyShardedDataParallel. Gradients are reduced on every backward
/// and accumulate in the shards, so accumulating batches still communicate (there is no
/// set_gradient_sync(false) to skip it, as in PyTorch's FSDP without no_sync). Checkpoints
/// (StateDictType): whole tensors gathered from every rank, which load in Python, in one process
/// and in DDP (default); or sharded directories, each rank writing its pieces, in Lockstep's
/// format or DCP's (which Python's torch.distributed.checkpoint reads). Each resumes.
///
///   trainer.set_strategy(std::make_shared<strategies::FSDPStrategy>(
///       distributed::ShardingOptions().sharding_strategy(distributed::ShardingStrategy::shard_grad_op)
///           .auto_wrap_module_types({"Block"})));
class FSDPStrategy : public ParallelStrategy {
 public:
  /// `name` is the registered name the strategy reports ("fsdp", "fsdp_hybrid_shard", ...).
  /// Defaults: FULL_SHARD with the whole module one unit, full checkpoints, "fsdp".
  explicit FSDPStrategy(distributed::ShardingOptions options = {}, StateDictType state_dict_type = StateDictType::full,
                        std::string name = "fsdp");

  /// Refuses a float16 param_dtype off CUDA: LibTorch's CPU matmuls have no float16.
  void set_context(const StrategyContext& context) override;

  std::shared_ptr<WrappedModule> setup_module(const std::shared_ptr<torch::nn::Module>& module) override;
  void teardown() override;
  torch::Tensor training_step(TrainingModule& module, Batch& batch, int64_t batch_idx) override;
  void before_evaluation_step() override;
  bool evaluation_steps_meet() const override { return true; }

  double clip_grad_norm(const std::vector<torch::Tensor>& parameters, double max_norm, double norm_type) override;
  /// clip_grad_norm with an infinite max_norm, which clips nothing.
  double gradient_norm(const std::vector<torch::Tensor>& parameters, double norm_type) override {
    return clip_grad_norm(parameters, INFINITY, norm_type);
  }
  void check_optimizer(const torch::optim::Optimizer& optimizer) const override;
  bool shards_state() const override { return true; }
  c10::Dict<std::string, torch::Tensor> module_state_dict(const torch::nn::Module& module) override;
  void load_module_state_dict(torch::nn::Module& module, const c10::impl::GenericDict& state, bool strict) override;
  c10::impl::GenericDict optimizer_state_dict(const torch::optim::Optimizer& optimizer) override;
  void load_optimizer_state_dict(torch::optim::Optimizer& optimizer, const c10::impl::GenericDict& state) override;
  /// This rank's 1-D pieces of the parameters (the whole, flattened, where one is not sharded)
  /// and the buffers whole.
  std::vector<std::pair<std::string, torch::Tensor>> local_weights(const torch::nn::Module& module) override;
  /// Into this rank's pieces; the next forward gathers the new values.
  void load_local_weights(torch::nn::Module& module, const std::map<std::string, torch::Tensor>& values) override;
  bool saves_pieces() const override { return state_dict_type_ != StateDictType::full; }
  /// Sharded and dcp: every rank writes its pieces into the directory `path`, rank 0 commits it
  /// (a collective).
  void save_checkpoint(const checkpoint::Checkpoint& state, const std::string& path, const checkpoint::CheckpointIO& io,
                       const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers) override;
  /// Sharded and dcp: a sharded or DCP directory (told apart by metadata.json and .metadata) gives
  /// only this rank's pieces (of the layout of this world size, whatever the world size that
  /// saved it); a full file loads whole and is cut here.
  checkpoint::Checkpoint load_checkpoint(const std::string& path, const checkpoint::CheckpointIO& io,
                                         const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers) override;

  distributed::ShardingOptions& sharding_options() { return options_; }
  const distributed::ShardingOptions& sharding_options() const { return options_; }
  StateDictType state_dict_type() const { return state_dict_type_; }
  void state_dict_type(StateDictType type) { state_dict_type_ = type; }
  /// The wrapper of the module set up last (null before setup_module).
  const std::shared_ptr<distributed::FullyShardedDataParallelBase>& fsdp() const { return fsdp_; }

 protected:
  /// Each unit gathered in turn, this rank keeping what `wanted` accepts (a collective).
  c10::Dict<std::string, torch::Tensor> whole_tensors(const torch::nn::Module& module,
                                                      const std::function<bool(const std::string&)>& wanted) override;
  /// The parameters' whole sizes, though each rank holds a piece.
  std::vector<std::pair<std::string, int64_t>> whole_sizes(const torch::nn::Module& module) override;

 private:
  /// The wrapper of `module`, or null when none wraps it.
  distributed::FullyShardedDataParallelBase* wrapper_of(const torch::nn::Module& module) const;
  /// The wrapper whose module holds `parameter`, or UsageError naming what was asked.
  distributed::FullyShardedDataParallelBase& wrapper_of(const torch::Tensor& parameter, const std::string& what) const;

  /// For a sharded save or load: where this rank's piece of a checkpoint's tensor lies, by its key
  /// ("state_dict/fc1.weight", "optimizer_states/0/state/3/exp_avg"); buffers are not sharded.
  /// UsageError naming `path` and the key for one this run has no tensor for.
  distributed::FullyShardedDataParallelBase::PieceInfo locate(
      const std::string& key, const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers,
      const std::string& path) const;

  /// Writes this rank's `shard` of the checkpoint at `path` in the state dict type's format, and
  /// on rank 0 commits it (a collective).
  void write_pieces(const checkpoint::ShardedCheckpoint& shard, const std::string& path,
                    const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers);
  /// UsageError unless the DCP checkpoint at `path` numbers its optimizer's parameters as
  /// `optimizer` does (its optimizer state is found by that number).
  void check_dcp_parameters(const std::string& path, const torch::optim::Optimizer& optimizer) const;
  /// This rank's pieces of the parameters and buffers and the optimizers' per-element state, by
  /// checkpoint key, sharing the live tensors' memory: a DCP load reads into them (as PyTorch's
  /// dcp.load into get_state_dict's tensors) instead of into new memory. State an optimizer has
  /// not made yet (before its first step) is absent.
  std::map<std::string, torch::Tensor> live_pieces(const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers);
  /// The name of each parameter of `optimizer` (by the modules set up), for a DCP save.
  std::vector<std::string> parameter_names(const torch::optim::Optimizer& optimizer) const;

  distributed::ShardingOptions options_;
  StateDictType state_dict_type_;
  std::shared_ptr<distributed::FullyShardedDataParallelBase> fsdp_;
  std::vector<std::shared_ptr<distributed::FullyShardedDataParallelBase>> all_;
};

}  // namespace strategies
}  // namespace lockstep
