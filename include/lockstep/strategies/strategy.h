#pragma once
/// Strategy: how training is spread over processes and devices (Lightning Fabric's seam).
/// Only the name is pure virtual; the defaults are those of one process on one device.

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <lockstep/accelerators/device_parser.h>
#include <lockstep/checkpoint/checkpoint_io.h>
#include <lockstep/core/batch.h>
#include <lockstep/distributed/collectives.h>
#include <lockstep/launchers/launcher.h>
#include <lockstep/strategies/wrapped_module.h>

namespace lockstep {
class DataLoader;
class TrainingModule;
namespace environments {
class ClusterEnvironment;
}

namespace strategies {

/// Which tensors to keep, by name and value (a tensor it refuses is left out).
using TensorFilter = std::function<bool(const std::string& name, const torch::Tensor& tensor)>;

/// What the connector resolved before the strategy starts.
struct StrategyContext {
  std::shared_ptr<environments::ClusterEnvironment> environment;
  accelerators::Accelerator accelerator = accelerators::Accelerator::cpu;
  /// Processes per node (CPU) or the GPU ids of this node (CUDA).
  int devices_per_node = 1;
  std::vector<int> gpu_ids;
  int num_nodes = 1;
  std::string process_group_backend = "gloo";
  double timeout_seconds = 1800;
  double liveness_timeout_seconds = 15;
  bool sync_batchnorm = false;
  /// --distributed-debug detail: collectives compare their calls across ranks first.
  bool check_collectives = false;
  /// --max-restarts: how often the launcher this strategy makes may start the job again.
  int max_restarts = 0;
};

class Strategy {
 public:
  virtual ~Strategy() = default;
  /// The registered name ("single_device", "ddp", ...).
  virtual std::string name() const = 0;
  /// Called by the connector before anything else.
  virtual void set_context(const StrategyContext& context) { context_ = context; }
  const StrategyContext& context() const { return context_; }

  /// The launcher that creates this node's processes, or null when none is needed (one process,
  /// or a scheduler such as torchrun or srun started them).
  virtual std::unique_ptr<launchers::Launcher> launcher() { return nullptr; }
  /// After launching, in every process: join the process group.
  virtual void setup_environment() {}
  virtual torch::Device root_device() const { return torch::Device(torch::kCPU); }
  virtual void module_to_device(torch::nn::Module& module) { module.to(root_device()); }
  /// Wraps the module for training (DDP does it here); the module is already on its device. The
  /// Trainer sets up one module, Fabric one or more; each gets its own wrapper.
  virtual std::shared_ptr<WrappedModule> setup_module(const std::shared_ptr<torch::nn::Module>& module) {
    return std::make_shared<WrappedModule>();
  }
  virtual void teardown() {}

  // One training step.
  virtual torch::Tensor training_step(TrainingModule& module, Batch& batch, int64_t batch_idx);
  /// Before each validation, test and predict step, which call the module directly: a sharded
  /// strategy gathers the parameters the module's forward needs.
  virtual void before_evaluation_step() {}
  /// Whether every rank must run as many evaluation and predict steps as the others (a sharded
  /// strategy's steps gather parameters together): predict then keeps the padded split.
  virtual bool evaluation_steps_meet() const { return false; }
  /// The backward of the Trainer's automatic step and of Fabric::backward: the forwards through
  /// the wrappers armed the reduction.
  virtual void backward(const torch::Tensor& loss) { loss.backward(); }
  /// TrainingModule::manual_backward: a backward inside a manually optimised training_step.
  virtual void manual_backward(const torch::Tensor& loss) { backward(loss); }
  /// Whether the next backward synchronises gradients (false on accumulating batches).
  virtual void set_gradient_sync(bool enabled) {}

  // Gradients and state as the strategy holds them (whole here; a sharded strategy gathers).
  /// Scales the gradients of `parameters` so that their total norm (order `norm_type`) is at most
  /// `max_norm`; returns the norm before clipping. Here torch::nn::utils::clip_grad_norm_; a
  /// sharded strategy takes the norm over every rank's shards.
  virtual double clip_grad_norm(const std::vector<torch::Tensor>& parameters, double max_norm, double norm_type);
  /// The total norm of the gradients of `parameters` (order `norm_type`), changing nothing; over
  /// every rank's shards under a sharded strategy.
  virtual double gradient_norm(const std::vector<torch::Tensor>& parameters, double norm_type);
  /// Throws UsageError for an optimizer this strategy cannot step right (called when optimizers
  /// are set up).
  virtual void check_optimizer(const torch::optim::Optimizer& optimizer) const {}
  /// Whether each rank holds only a shard of the gradients and optimizer state: checkpoint state
  /// is then collected by every rank (a collective), not by rank 0 alone, and a loss scaler's
  /// inf check, made on each rank's shard, could skip the step on some ranks only.
  virtual bool shards_state() const { return false; }
  /// The module's parameters and buffers, whole, for a checkpoint (checkpoint::state_dict here).
  virtual c10::Dict<std::string, torch::Tensor> module_state_dict(const torch::nn::Module& module);
  /// Loads whole tensors by name into the module; strict: every name of the module, no other.
  virtual void load_module_state_dict(torch::nn::Module& module, const c10::impl::GenericDict& state,
                                      bool strict = true);
  /// The optimizer's state in Python's layout, whole (checkpoint::optimizer_state_dict here).
  virtual c10::impl::GenericDict optimizer_state_dict(const torch::optim::Optimizer& optimizer);
  /// Loads a state from optimizer_state_dict() (also one saved by another strategy).
  virtual void load_optimizer_state_dict(torch::optim::Optimizer& optimizer, const c10::impl::GenericDict& state);
  /// The module's parameters and buffers by name as this rank holds them, sharing their memory
  /// (clone to keep): whole here (DDP's replicas are equal); a sharded strategy gives this rank's
  /// 1-D pieces of the parameters. For copies kept beside the weights in the same layout (weight
  /// averaging); no collective.
  virtual std::vector<std::pair<std::string, torch::Tensor>> local_weights(const torch::nn::Module& module);
  /// Copies `values` (by name, laid out as local_weights gives them) into the module; names left
  /// out keep their values. No collective.
  virtual void load_local_weights(torch::nn::Module& module, const std::map<std::string, torch::Tensor>& values);
  /// Whether module_state_dict and optimizer_state_dict give this rank's pieces, which only
  /// save_checkpoint can write (FSDP with state_dict_type sharded or dcp); false: whole tensors.
  virtual bool saves_pieces() const { return false; }
  /// Writes the module's weights (parameters and buffers, whole) as safetensors at `path`, on
  /// every rank (a collective), keeping the tensors `keep` accepts (all when empty):
  /// - a `.safetensors` path: one file, written by rank 0;
  /// - a `.safetensors.index.json` path with several ranks: Hugging Face's sharded form, one
  ///   shard per rank, each rank writing the tensors it owns (runs of names in sorted order, about
  ///   equal bytes) and rank 0 the index; a sharded strategy gathers each tensor to its owner
  ///   only, so no rank holds the whole model. With one rank: shards of at most 5 GB.
  ///   strategy.save_safetensors(*net, "out/model.safetensors.index.json");
  void save_safetensors(const torch::nn::Module& module, const std::string& path, const TensorFilter& keep = {});
  /// Writes the Trainer's checkpoint `state`, made with the hooks above (`optimizers`: those of
  /// its "optimizer_states", in order), to `path`. Called where `state` was made: on every rank
  /// where shards_state(), else on rank 0; the caller's barrier follows. Here rank 0 writes one
  /// file with `io`; a strategy that saves pieces writes a sharded checkpoint directory.
  virtual void save_checkpoint(const checkpoint::Checkpoint& state, const std::string& path,
                               const checkpoint::CheckpointIO& io,
                               const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers);
  /// Reads the checkpoint at `path` for the load hooks above: a file with `io`, or a sharded or
  /// DCP checkpoint directory (of any world size) put back together whole. Throws UsageError naming
  /// the path for a missing or damaged one.
  virtual checkpoint::Checkpoint load_checkpoint(const std::string& path, const checkpoint::CheckpointIO& io,
                                                 const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers);

  // Ranks and collectives (trivial with one process).
  /// The ranks' process group once set up; null for one process.
  virtual std::shared_ptr<distributed::ProcessGroup> group() const { return nullptr; }
  virtual int world_size() const { return 1; }
  virtual int global_rank() const { return 0; }
  virtual int local_rank() const { return 0; }
  virtual int node_rank() const { return 0; }
  bool is_global_zero() const { return global_rank() == 0; }
  virtual torch::Tensor all_reduce(torch::Tensor tensor, distributed::ReduceOp op = distributed::ReduceOp::mean) {
    return tensor;
  }
  virtual std::vector<torch::Tensor> all_gather(const torch::Tensor& tensor) { return {tensor}; }
  virtual void barrier(const std::string& name) {}
  virtual c10::IValue broadcast(const c10::IValue& value, int src = 0) { return value; }
  virtual bool reduce_boolean_decision(bool decision, distributed::Decision rule = distributed::Decision::all) {
    return decision;
  }
  /// num_replicas and rank for a DistributedSampler, or nullopt when data is not split.
  virtual std::optional<std::pair<int, int>> distributed_sampler_kwargs() const { return std::nullopt; }

 protected:
  /// For save_safetensors, on every rank: the module's tensors whose names `wanted` accepts,
  /// whole (a sharded strategy gathers them: a collective); and every tensor's whole size in
  /// bytes, in the order of the module's state_dict.
  virtual c10::Dict<std::string, torch::Tensor> whole_tensors(const torch::nn::Module& module,
                                                              const std::function<bool(const std::string&)>& wanted);
  virtual std::vector<std::pair<std::string, int64_t>> whole_sizes(const torch::nn::Module& module);

  StrategyContext context_;
};

/// Puts a DistributedSampler on `loader` when `strategy` splits data over ranks and the loader has
/// no sampler yet; `shuffle` and the loader's seed order each epoch, `unrepeated` gives every
/// example once (SamplerOptions::unrepeated). True when it put one on.
bool add_distributed_sampler(const Strategy& strategy, DataLoader& loader, bool shuffle, bool unrepeated = false);

/// One process, one device: what `--strategy single_device` (and auto with one device) runs.
class SingleDeviceStrategy : public Strategy {
 public:
  std::string name() const override { return "single_device"; }
  torch::Device root_device() const override;
};

}  // namespace strategies
}  // namespace lockstep
