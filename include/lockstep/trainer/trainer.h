#pragma once
/// Trainer: runs a TrainingModule's fit, validate, test and predict loops on one process or many,
/// as Lightning's Trainer does.

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <lockstep/callbacks/callback.h>
#include <lockstep/callbacks/profiler.h>
#include <lockstep/checkpoint/checkpoint_io.h>
#include <lockstep/core/trainer_view.h>
#include <lockstep/core/training_module.h>
#include <lockstep/data/data_loader.h>
#include <lockstep/distributed/agreed_stop.h>
#include <lockstep/plan/connector.h>
#include <lockstep/plan/grad_scaler.h>
#include <lockstep/strategies/strategy.h>
#include <lockstep/trainer/metrics.h>
#include <lockstep/trainer/predict_options.h>
#include <lockstep/trainer/trainer_options.h>

namespace lockstep {
namespace detail {
class AttemptRecord;
}  // namespace detail

namespace loggers {
class Logger;
}
using loggers::Logger;
class Tuner;

/// Loaders for each stage; the Trainer puts a DistributedSampler on them under DDP (unless a
/// loader has a sampler already or use_distributed_sampler is false).
class DataModule {
 public:
  virtual ~DataModule() = default;
  virtual std::shared_ptr<DataLoader> train_dataloader() = 0;
  virtual std::shared_ptr<DataLoader> val_dataloader() { return nullptr; }
  virtual std::shared_ptr<DataLoader> test_dataloader() { return nullptr; }
  virtual std::shared_ptr<DataLoader> predict_dataloader() { return nullptr; }
};

///   lockstep::TrainerOptions options;                 // or parsed from flags, see cli/
///   lockstep::Trainer trainer(options.devices("2").max_epochs(3));
///   trainer.fit(model, train_loader, val_loader);     // launches rank 1 and trains on both
class Trainer : public TrainerView {
 public:
  /// Fields of `options` still at their defaults take their LOCKSTEP_TRAINER_* variables
  /// (apply_trainer_variables), unless the options came through cli::add_trainer_flags.
  explicit Trainer(TrainerOptions options = {});
  ~Trainer();

  /// A Strategy object instead of the --strategy name (e.g. a DDPStrategy subclass); --strategy
  /// must then stay auto or be its name.
  void set_strategy(std::shared_ptr<strategies::Strategy> strategy) { user_strategy_ = std::move(strategy); }
  /// Your own ClusterEnvironment instead of the detected one (Lightning's
  /// plugins=[MyClusterEnvironment()]): the job takes its ranks, world size and main address.
  /// Before fit; its creates_processes_externally() must be true.
  void set_cluster_environment(std::shared_ptr<environments::ClusterEnvironment> environment);
  void add_callback(std::shared_ptr<Callback> callback) { callbacks_.push_back(std::move(callback)); }
  /// Times hooks and loop phases with `profiler` (options.profiler() "simple" makes a
  /// SimpleProfiler, "pytorch" a PyTorchProfiler); its summary goes to stderr on rank 0 at the end
  /// of fit.
  void set_profiler(std::shared_ptr<Profiler> profiler) { profiler_ = std::move(profiler); }
  /// The profiler in use, or null when profiling is off.
  Profiler* profiler() const { return profiler_.get(); }
  /// Replaces the default CSV logger; call once per logger.
  void add_logger(std::shared_ptr<Logger> logger);
  /// Where checkpoints are saved, loaded and removed (Lightning's `plugins=[checkpoint_io]`): every
  /// save_checkpoint, resume and ModelCheckpoint file goes through it. Default: CheckpointIO.
  void set_checkpoint_io(std::shared_ptr<checkpoint::CheckpointIO> io);
  checkpoint::CheckpointIO& checkpoint_io() const { return *checkpoint_io_; }

  /// Trains, validating on `val` (may be null). Ctrl-C (SIGINT), SIGTERM or SIGUSR1 to any rank
  /// stops every rank after the same step: last.ckpt is saved (after SIGINT only when
  /// checkpointing is on) and fit throws StoppedBySignal (training_stopped.h); a second signal
  /// ends the process at once.
  void fit(const std::shared_ptr<TrainingModule>& module, const std::shared_ptr<DataLoader>& train,
           const std::shared_ptr<DataLoader>& val = nullptr);
  /// Trains on data.train_dataloader(), validating on data.val_dataloader() (may be null).
  void fit(const std::shared_ptr<TrainingModule>& module, DataModule& data);
  /// One pass over `loader` in evaluation mode; returns the epoch metrics.
  std::map<std::string, double> validate(const std::shared_ptr<TrainingModule>& module,
                                         const std::shared_ptr<DataLoader>& loader);
  std::map<std::string, double> test(const std::shared_ptr<TrainingModule>& module,
                                     const std::shared_ptr<DataLoader>& loader);
  /// predict_step outputs of this rank's batches. Under DDP the ranks split the loader as
  /// Lightning's predict does: every example once, none twice, so ranks may run one batch more
  /// than others (a strategy whose steps meet, FSDP, keeps the padded split and drops the
  /// repeats' outputs). With `options.gather()` every rank returns all outputs in dataset order.
  std::vector<torch::Tensor> predict(const std::shared_ptr<TrainingModule>& module,
                                     const std::shared_ptr<DataLoader>& loader, PredictOptions options = {});
  /// The same on the DataModule's loader for the stage; a UsageError when it returns none.
  std::map<std::string, double> validate(const std::shared_ptr<TrainingModule>& module, DataModule& data);
  std::map<std::string, double> test(const std::shared_ptr<TrainingModule>& module, DataModule& data);
  std::vector<torch::Tensor> predict(const std::shared_ptr<TrainingModule>& module, DataModule& data,
                                     PredictOptions options = {});

  // State, as Lightning's trainer.* attributes.
  const TrainerOptions& options() const { return options_; }
  strategies::Strategy& strategy();
  const std::vector<std::shared_ptr<Logger>>& loggers() const { return loggers_; }
  const std::vector<std::shared_ptr<Callback>>& callbacks() const { return callbacks_; }
  TrainingModule* module() const { return module_.get(); }
  bool should_stop() const { return should_stop_; }
  /// The checkpoint dictionary itself (what save_checkpoint writes).
  c10::impl::GenericDict checkpoint_state() const;

  // TrainerView: what modules and callbacks see.
  int64_t current_epoch() const override { return current_epoch_; }
  int64_t global_step() const override { return global_step_; }
  bool sanity_checking() const override { return sanity_checking_; }
  int64_t num_training_batches() const override { return num_training_batches_; }
  int64_t num_val_batches() const override { return num_val_batches_; }
  /// val_check_interval resolved against num_training_batches (equal to it when validating at
  /// epoch ends only).
  int64_t val_check_batch() const override { return val_check_batch_; }
  int64_t check_val_every_n_epoch() const override { return options_.check_val_every_n_epoch(); }
  int64_t log_every_n_steps() const override { return options_.log_every_n_steps(); }
  int global_rank() override;
  int world_size() override;
  torch::Device root_device() override;
  const std::map<std::string, double>& callback_metrics() const override { return callback_metrics_; }
  std::map<std::string, double> progress_bar_metrics() const override;
  std::map<std::string, double> train_epoch_means() const override { return metrics_.train_epoch_means(); }
  void log(const std::string& name, double value, const LogOptions& options) override;
  void log_metrics(const std::map<std::string, double>& metrics, int64_t step) override;
  std::string log_dir() const override;
  const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers() const override {
    return optimizer_config_.optimizers;
  }
  const std::vector<SchedulerConfig>& lr_schedulers() const override { return optimizer_config_.schedulers; }
  void manual_backward(const torch::Tensor& loss) override;
  /// Set by a callback (EarlyStopping) to end fit after the current epoch; all ranks agree.
  void request_stop() override { should_stop_ = true; }
  void save_checkpoint(const std::string& path) override;
  bool save_checkpoint_alone(const std::string& path) override;
  int64_t fast_dev_run() override { return options_.fast_dev_run(); }
  std::vector<std::pair<std::string, torch::Tensor>> local_weights() override;
  void load_local_weights(const std::map<std::string, torch::Tensor>& values) override;
  c10::Dict<std::string, torch::Tensor> checkpoint_weights(const std::map<std::string, torch::Tensor>& values) override;
  std::map<std::string, torch::Tensor> local_weights_of(const c10::impl::GenericDict& state) override;
  int64_t max_epochs() const override { return options_.max_epochs(); }
  void forward_training_batches() override;
  void remove_checkpoint(const std::string& path) override;
  std::vector<torch::Tensor> all_gather(const torch::Tensor& tensor) override;
  c10::IValue broadcast(const c10::IValue& value, int root = 0) override;
  bool any_rank(bool decision) override;

 private:
  friend class Tuner;  // its searches run the training loop and undo it (tuner.cpp)
  /// What a search changes, put back exactly: weights, optimizer states, counters, generator.
  class TuningScope;
  void run_fit(const std::shared_ptr<TrainingModule>& module, const std::shared_ptr<DataLoader>& train,
               const std::shared_ptr<DataLoader>& val);
  void setup(const std::shared_ptr<TrainingModule>& module);
  /// Callbacks' on_exception, when fit fails once started; a hook's own error is reported, not thrown.
  void notify_exception(const std::exception& error);
  void check_resume_source();
  /// --init-weights: the file read before launch, then loaded into the module before it is set up.
  void check_init_weights_source();
  void load_init_weights();
  /// Before launch: the weights of --init-weights and of a --ckpt-path file read then fit `module`.
  void check_weights_match(const torch::nn::Module& module) const;
  /// After a failed fit, on rank 0: the run folder its loggers made, when nothing was written in it.
  void remove_empty_run_folder() noexcept;
  void record_resume(const std::string& path, const std::string& origin) const;
  /// The run folder, chosen by rank 0's first logger (the default CSVLogger unless loggers were
  /// added), on every rank.
  void choose_log_dir();
  /// A checkpoint's "loops": the epoch and batch to go on from, at this world size.
  void restore_loops(const c10::impl::GenericDict& loops);
  /// Under a launcher that restarts the job: the version folder --ckpt-path last continues in.
  std::optional<int64_t> continued_version() const;
  /// Under a launcher that restarts the job, on rank 0: the line saying what the last attempt's
  /// end cost (elastic_run.h), then this attempt's progress record.
  void start_attempt_record(bool resumed);
  std::string why_nothing_trained(int64_t epoch, int64_t max_epochs) const;
  void attach_sampler(DataLoader& loader, bool shuffle);
  /// A validation or test loader's sampler; rank 0 says once what its padding does to `stage`.
  void attach_evaluation_sampler(DataLoader& loader, const std::string& stage);
  /// fit's loaders: their samplers, and in order under --overfit-batches (rank 0 says so).
  void attach_fit_samplers(DataLoader& train, DataLoader* val);
  /// The note on --benchmark where it does nothing or meets --deterministic.
  void note_benchmark() const;
  /// False when --ckpt-path last finds no checkpoint (fit then starts afresh).
  bool restore(const std::string& ckpt_path);
  /// --ckpt-path last: the newest last.ckpt beside this run's folder; "" (and a note) when none.
  std::string last_checkpoint() const;
  /// The optimizer states of a checkpoint being resumed, after its schedulers' steps are replayed.
  void restore_optimizers(const checkpoint::Checkpoint& ckpt, const std::string& path);
  /// A Lightning checkpoint in the layout of the Trainer's own; prints what did not carry over.
  checkpoint::Checkpoint from_lightning(const checkpoint::Checkpoint& ckpt, const std::string& path) const;
  void run_training_epoch(DataLoader& train, DataLoader* val);
  /// The epoch's sampler order, its length and its start hooks.
  void start_training_epoch(DataLoader& train);
  /// Batch `i`: its step, its backward and, when `step_now`, the optimizer step; then its hooks.
  /// Returns the step's loss (undefined when the step returned none).
  torch::Tensor run_training_batch(DataLoader& train, int64_t i, bool step_now, bool automatic);
  /// The tuners' training: `steps` optimizer steps over `train` from its first batch, into the
  /// next epochs when it has fewer, calling `before(k)` ahead of step k's batches and
  /// `after(k, loss)` after it with the loss averaged over the ranks (NaN when the step returned
  /// none); `after` returning true stops. Returns the steps run.
  int64_t run_tuning_steps(DataLoader& train, int64_t steps, const std::function<void(int64_t)>& before,
                           const std::function<bool(int64_t, double)>& after);
  /// --scale-batch-size and --lr-find, before fit trains (tuner.cpp).
  void tune_for_fit(const std::shared_ptr<DataLoader>& train);
  /// Before launch: the tuning flags' values, and not with --ckpt-path.
  void check_tuning_options() const;
  /// The epoch's end: its metrics, a validation on `val` unless null, the epoch schedulers, the hooks.
  void end_training_epoch(DataLoader* val);
  void run_validation(DataLoader& val);
  /// fit's validation batches before training (--num-sanity-val-steps), logging nothing.
  void run_sanity_check(DataLoader& val);
  /// After an optimizer step: asks every rank to stop when this rank's loss is not finite.
  void check_loss(const torch::Tensor& loss, int64_t batch_idx);
  /// Ends fit after the ranks agreed to stop: last.ckpt for a signal, then the error.
  [[noreturn]] void end_stopped_fit(const distributed::StopRequest& request);
  std::map<std::string, double> run_evaluation(DataLoader& loader, Phase phase, int64_t max_batches);
  void optimizer_step();
  /// A null scheduler, an unknown interval, a ReduceLROnPlateau without monitor (or a monitor on another).
  void check_schedulers() const;
  /// Steps the schedulers of `interval` ("epoch", "step"), each ReduceLROnPlateau with its metric.
  void step_schedulers(const std::string& interval);
  /// Rank 0's value of the metric `config` monitors, on every rank; none (after one warning) when
  /// missing and not strict; a UsageError naming the logged metrics when strict.
  std::optional<double> monitored_value(const SchedulerConfig& config, size_t index);
  /// Each scheduler's ReduceLROnPlateau state, in order (an empty dict for other schedulers).
  c10::impl::GenericList plateau_states() const;
  /// A checkpoint's "lr_schedulers": step counts replayed, ReduceLROnPlateau states loaded.
  void restore_schedulers(const c10::impl::GenericDict& saved, const std::string& path);
  /// Rows are labelled with `epoch` (default: the current one).
  void emit_step_metrics(bool force, std::optional<int64_t> epoch = std::nullopt);
  void emit(const std::map<std::string, double>& metrics, std::optional<int64_t> epoch = std::nullopt);
  torch::Tensor run_step(const std::function<torch::Tensor()>& step);
  void print_fit_end(double seconds);
  /// Runs `fn` on every callback, each timed as "[Callback]<name>.<hook>" when profiling.
  template <typename Fn>
  void each_callback(const char* hook, Fn&& fn);
  /// A timing scope for `action`; inert when profiling is off.
  Profiler::Scope profile(std::string_view action) { return Profiler::Scope(profiler_.get(), action); }
  /// A ProgressBar and a ModelCheckpoint unless disabled or given; checkpoints run last.
  void add_default_callbacks();
  /// --fast-dev-run: no logger writes, and rank 0 says so.
  void suppress_for_fast_dev_run();

  TrainerOptions options_;
  std::shared_ptr<strategies::Strategy> user_strategy_;
  std::shared_ptr<environments::ClusterEnvironment> user_environment_;
  std::vector<std::shared_ptr<Callback>> callbacks_;
  std::vector<std::shared_ptr<Logger>> loggers_;
  std::shared_ptr<checkpoint::CheckpointIO> checkpoint_io_;
  std::optional<checkpoint::Checkpoint> early_checkpoint_;  // --ckpt-path, read before launch
  std::optional<c10::impl::GenericDict> init_weights_;      // --init-weights, read before launch
  bool loggers_set_by_user_ = false;
  std::string log_dir_;
  std::string claimed_run_dir_;  ///< rank 0's: the folder its loggers made at setup
  std::string resumed_path_;     ///< the checkpoint fit resumed, "last" resolved
  std::unique_ptr<detail::AttemptRecord> attempt_record_;  ///< rank 0's, under a restarting launcher
  std::string model_summary_;  ///< rank 0's, taken at setup, printed when fit starts

  ExecutionPlan plan_;
  bool set_up_ = false;
  std::shared_ptr<TrainingModule> module_;
  OptimizerConfig optimizer_config_;
  std::optional<GradScaler> scaler_;  // 16-mixed only
  MetricCollection metrics_;
  std::map<std::string, double> callback_metrics_;
  int64_t current_epoch_ = 0;
  int64_t global_step_ = 0;
  int64_t num_training_batches_ = 0;
  int64_t num_val_batches_ = 0;
  int64_t val_check_batch_ = 1;
  bool should_stop_ = false;
  bool sanity_checking_ = false;
  bool epoch_completed_ = false;
  int64_t batches_done_ = 0;   // training batches run in the current epoch
  int64_t step_boundary_batch_ = 0;  // batches_done_ at the epoch's last optimizer step
  bool fit_started_ = false;   // from on_fit_start to the end of the loop: on_exception applies
  int64_t resume_batch_ = 0;   // the batch the first epoch starts at (a mid-epoch checkpoint)
  distributed::AgreedStop* agreed_stop_ = nullptr;  // during fit
  std::optional<distributed::StopRequest> stop_request_;
  int64_t scheduler_epoch_steps_ = 0;
  int64_t scheduler_step_steps_ = 0;
  std::set<size_t> missing_monitor_warned_;  // schedulers whose missing metric rank 0 reported
  std::shared_ptr<Profiler> profiler_;
  DataLoader* fit_train_ = nullptr;  // fit's training loader, during fit
};

}  // namespace lockstep
