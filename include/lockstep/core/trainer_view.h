#pragma once
/// TrainerView: what a TrainingModule and a Callback see of the Trainer running them (Lightning's
/// `self.trainer` and the `trainer` argument of callback hooks): its progress, this process's place
/// in the job, the metrics, and the few actions they may take. lockstep::Trainer implements it;
/// a callback that needs more (the strategy, the loggers) can dynamic_cast to lockstep::Trainer.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <torch/types.h>

#include <lockstep/core/log_options.h>
#include <lockstep/core/optimizer_config.h>

namespace lockstep {

class TrainingModule;

class TrainerView {
 public:
  virtual ~TrainerView() = default;

  // Progress.
  virtual int64_t current_epoch() const = 0;
  virtual int64_t global_step() const = 0;
  /// True during the validation sanity check before training (nothing is logged then).
  virtual bool sanity_checking() const = 0;
  /// Training batches per epoch after limit_train_batches (known once fit started).
  virtual int64_t num_training_batches() const = 0;
  virtual int64_t num_val_batches() const = 0;
  /// Validation runs after every this many training batches of an epoch.
  virtual int64_t val_check_batch() const = 0;
  virtual int64_t check_val_every_n_epoch() const = 0;
  virtual int64_t log_every_n_steps() const = 0;

  // This process in the job (rank 0 of 1 before a run starts).
  virtual int global_rank() = 0;
  virtual int world_size() = 0;
  bool is_global_zero() { return global_rank() == 0; }
  /// The device steps run on.
  virtual torch::Device root_device() = 0;

  // Metrics and logs.
  /// Latest step metrics and epoch metrics, by logged name (what callbacks monitor).
  virtual const std::map<std::string, double>& callback_metrics() const = 0;
  virtual std::map<std::string, double> progress_bar_metrics() const = 0;
  /// The last training epoch's mean of each value logged on_step only (weighted by batch size,
  /// this rank's), by logged name: what the progress bar's epoch line shows for them.
  virtual std::map<std::string, double> train_epoch_means() const { return {}; }
  /// Records a value as TrainingModule::log does.
  virtual void log(const std::string& name, double value, const LogOptions& options) = 0;
  /// Sends `metrics` at `step` to every logger (call on rank 0).
  virtual void log_metrics(const std::map<std::string, double>& metrics, int64_t step) = 0;
  /// The run's folder (e.g. ./lockstep_logs/version_0), where checkpoints go by default.
  virtual std::string log_dir() const = 0;

  // Optimisation.
  virtual const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers() const = 0;
  virtual const std::vector<SchedulerConfig>& lr_schedulers() const = 0;
  /// loss.backward() with the strategy's gradient synchronisation.
  virtual void manual_backward(const torch::Tensor& loss) = 0;

  // The weights as the strategy holds them, for callbacks that keep a copy beside them (weight
  // averaging): whole under one process and DDP, this rank's pieces under FSDP.
  /// The module's parameters and buffers by name as this rank holds them, sharing their memory
  /// (clone to keep): whole, or this rank's 1-D pieces of the parameters under FSDP (buffers
  /// whole). No collective.
  virtual std::vector<std::pair<std::string, torch::Tensor>> local_weights() { return {}; }
  /// Copies `values` (laid out as local_weights gives them) into the module; names left out keep
  /// their values. No collective.
  virtual void load_local_weights(const std::map<std::string, torch::Tensor>& values) {}
  /// `values` (as local_weights lays them out) as a checkpoint's state_dict holds the module's
  /// weights: whole, or this rank's pieces where the strategy saves pieces (FSDP sharded). Where
  /// the strategy shards its state (FSDP) a collective: every rank calls it, as checkpoints do.
  virtual c10::Dict<std::string, torch::Tensor> checkpoint_weights(const std::map<std::string, torch::Tensor>& values) {
    return c10::Dict<std::string, torch::Tensor>();
  }
  /// The reverse: weights from a checkpoint (whole, or this rank's pieces) laid out as
  /// local_weights gives them; names the module lacks are left out. No collective.
  virtual std::map<std::string, torch::Tensor> local_weights_of(const c10::impl::GenericDict& state) { return {}; }
  /// --max-epochs (-1: unset).
  virtual int64_t max_epochs() const { return -1; }
  /// One pass of training_step over this epoch's training batches in training mode, without
  /// gradients, backward or step, for statistics such as batch norm's (SWA's update_bn); every
  /// rank calls it. During fit (on_fit_end included) only: UsageError otherwise.
  virtual void forward_training_batches() {}

  /// --fast-dev-run's batch count (0: off): callbacks that write or stop stand aside.
  virtual int64_t fast_dev_run() { return 0; }

  // Actions.
  /// Ends fit after the current epoch.
  virtual void request_stop() = 0;
  /// Writes a checkpoint of the whole training state (rank 0 writes; every rank must call). A
  /// path ending in ".safetensors" or ".safetensors.index.json" gets the module's weights alone
  /// (Strategy::save_safetensors: the index form writes one shard per rank).
  virtual void save_checkpoint(const std::string& path) = 0;
  /// Writes a checkpoint of this rank's whole training state with no collective, for a run that is
  /// failing (other ranks may be stuck or gone); any rank may call it. False, writing nothing, where
  /// the state is sharded over the ranks (FSDP) and this rank holds only its pieces.
  virtual bool save_checkpoint_alone(const std::string& path) { return false; }
  /// Removes a checkpoint through the Trainer's CheckpointIO (call on rank 0); for a safetensors
  /// index, its shards too.
  virtual void remove_checkpoint(const std::string& path) = 0;

  // Across ranks (each rank must call).
  virtual std::vector<torch::Tensor> all_gather(const torch::Tensor& tensor) = 0;
  virtual c10::IValue broadcast(const c10::IValue& value, int root = 0) = 0;
  /// True on every rank when `decision` is true on any rank.
  virtual bool any_rank(bool decision) = 0;

 protected:
  /// Makes this the trainer `module` reaches (nullptr: none).
  static void attach(TrainingModule& module, TrainerView* trainer);
};

}  // namespace lockstep
