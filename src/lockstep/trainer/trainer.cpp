#include <lockstep/trainer/trainer.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <utility>

#include <nlohmann/json.hpp>
#include <torch/csrc/autograd/anomaly_mode.h>
#include <torch/torch.h>

#include <lockstep/accelerators/device_parser.h>
#include <lockstep/callbacks/model_checkpoint.h>
#include <lockstep/callbacks/progress_bar.h>
#include <lockstep/callbacks/pytorch_profiler.h>
#include <lockstep/callbacks/simple_profiler.h>
#include <lockstep/checkpoint/checkpoint_io.h>
#include <lockstep/core/number_text.h>
#include <lockstep/core/blas.h>
#include <lockstep/core/model_summary.h>
#include <lockstep/core/program_config.h>
#include <lockstep/core/seed.h>
#include <lockstep/core/error.h>
#include <lockstep/core/heap.h>
#include <lockstep/data/sampler.h>
#include <lockstep/environments/cluster_environment.h>
#include <lockstep/launchers/launcher.h>
#include <lockstep/loggers/csv_logger.h>

#include "elastic_run.h"
#include "trainer_internal.h"

namespace lockstep {
namespace {

// The profiler of TrainerOptions::profiler: simple (or true), pytorch, or none ("" or false).
std::shared_ptr<Profiler> named_profiler(const std::string& name) {
  if (name.empty() || name == "false") return nullptr;
  if (name == "simple" || name == "true") return std::make_shared<SimpleProfiler>();
  if (name == "pytorch") return std::make_shared<PyTorchProfiler>();
  throw UsageError("TrainerOptions::profiler is \"" + name +
                   "\": use \"simple\" (or \"true\"), \"pytorch\", or \"\" (off).");
}

std::shared_ptr<DataLoader> stage_loader(std::shared_ptr<DataLoader> loader, const std::string& hook) {
  if (!loader) {
    throw UsageError("DataModule::" + hook + "() returned no loader (the default); override it in your DataModule "
                     "to use the DataModule for this stage.");
  }
  return loader;
}

// Lightning's val_check_batch: validate after every this many training batches of an epoch: a
// fraction of the epoch's `batches` or a count; both must fit in the epoch.
int64_t resolve_val_check_batch(const BatchLimit& interval, int64_t batches) {
  if (interval.is_fraction()) {
    LOCKSTEP_CHECK(interval.fraction() > 0, UsageError, "--val-check-interval ", interval.str(), ": a fraction of the ",
                   "training epoch must be in (0, 1] (e.g. 0.25 validates four times an epoch); for every N batches ",
                   "write an integer. To skip validation use --limit-val-batches 0.");
    return std::max<int64_t>(1, interval.of(batches));
  }
  LOCKSTEP_CHECK(interval.count() >= 1, UsageError, "--val-check-interval ", interval.str(), ": a number of training ",
                 "batches must be at least 1 (e.g. 100, or a fraction such as 0.5). To skip validation use "
                 "--limit-val-batches 0.");
  LOCKSTEP_CHECK(batches == 0 || interval.count() <= batches, UsageError, "--val-check-interval ", interval.str(),
                 " but a training epoch has only ", batches, " batch(es) (after --limit-train-batches and the ",
                 "sampler). Use at most ", batches, ", or a fraction such as 0.5.");
  return interval.count();
}

template <typename T>
bool has_callback(const std::vector<std::shared_ptr<Callback>>& callbacks) {
  return std::any_of(callbacks.begin(), callbacks.end(), [](const auto& c) { return dynamic_cast<T*>(c.get()) != nullptr; });
}

// As LightningCLI's SaveConfigCallback: the resolved flags, which `--config <log_dir>/config.yaml`
// reads back to repeat the run.
void save_program_config(const std::string& log_dir) {
  const std::string yaml = program_config();
  if (yaml.empty()) return;
  const std::string path = (std::filesystem::path(log_dir) / "config.yaml").string();
  std::ofstream out(path, std::ios::trunc);
  out << yaml;
  if (!out.flush()) throw IoError("writing", path, errno);
}

}  // namespace

namespace {

// --fast-dev-run n: one epoch of n batches in each loop, no sanity check (as Lightning).
void apply_fast_dev_run(TrainerOptions& o) {
  const int64_t n = o.fast_dev_run();
  LOCKSTEP_CHECK(n >= 0, UsageError, "--fast-dev-run ", n, ": use a number of batches, 1 or more (0 turns it off).");
  if (n == 0) return;
  o.max_epochs(1).max_steps(n).limit_train_batches(n).limit_val_batches(n).limit_test_batches(n);
  o.num_sanity_val_steps(0).val_check_interval(1.0).check_val_every_n_epoch(1).enable_checkpointing(false);
}

// --overfit-batches b: b of the training and the validation batches, after --fast-dev-run, whose
// limits it replaces (as Lightning).
void apply_overfit_batches(TrainerOptions& o) {
  if (!overfitting(o)) return;
  o.limit_train_batches(o.overfit_batches()).limit_val_batches(o.overfit_batches());
}

// --deterministic true, as Lightning's deterministic=True: LibTorch's deterministic algorithms
// (cuDNN's convolutions among them), and the cuBLAS workspace that makes its matrix products
// deterministic on CUDA, unless the environment sets one. Before launch: the ranks inherit it.
void apply_deterministic(const TrainerOptions& o) {
  if (!o.deterministic()) return;
  at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
  at::globalContext().setDeterministicCuDNN(true);
  ::setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
}

}  // namespace

bool overfitting(const TrainerOptions& o) {
  const BatchLimit& b = o.overfit_batches();
  return b.is_fraction() ? b.fraction() > 0 : b.count() > 0;
}

Trainer::Trainer(TrainerOptions options)
    : options_(std::move(options)), checkpoint_io_(std::make_shared<checkpoint::CheckpointIO>()) {
  apply_trainer_variables(options_, environments::Environ::from_process());
  apply_fast_dev_run(options_);
  apply_overfit_batches(options_);
}

void Trainer::suppress_for_fast_dev_run() {
  loggers_.clear();  // Lightning puts a DummyLogger in their place
  if (!plan_.strategy->is_global_zero()) return;
  std::cerr << "lockstep: running in fast_dev_run mode: will run the requested loop using " << options_.fast_dev_run()
            << " batch(es). Logging and checkpointing is suppressed.\n";
}
Trainer::~Trainer() {
  if (module_) attach(*module_, nullptr);
}

void Trainer::set_cluster_environment(std::shared_ptr<environments::ClusterEnvironment> environment) {
  LOCKSTEP_CHECK(!set_up_, UsageError, "Trainer::set_cluster_environment after fit/validate/test/predict started: the "
                 "job already runs in its environment. Call it before.");
  LOCKSTEP_CHECK(environment, UsageError, "Trainer::set_cluster_environment: the environment is null; pass an object, "
                 "or leave the detected one.");
  user_environment_ = std::move(environment);
}

void Trainer::set_checkpoint_io(std::shared_ptr<checkpoint::CheckpointIO> io) {
  if (!io) throw UsageError("Trainer::set_checkpoint_io: the CheckpointIO is null; pass an object, or leave the default.");
  checkpoint_io_ = std::move(io);
}

void Trainer::add_logger(std::shared_ptr<Logger> logger) {
  if (!loggers_set_by_user_) loggers_.clear();
  loggers_set_by_user_ = true;
  loggers_.push_back(std::move(logger));
}

strategies::Strategy& Trainer::strategy() {
  if (!plan_.strategy) throw UsageError("trainer.strategy() is only known once fit/validate/test/predict started.");
  return *plan_.strategy;
}

int Trainer::global_rank() { return plan_.strategy ? plan_.strategy->global_rank() : 0; }
int Trainer::world_size() { return plan_.strategy ? plan_.strategy->world_size() : 1; }
torch::Device Trainer::root_device() { return plan_.strategy ? plan_.strategy->root_device() : torch::Device(torch::kCPU); }

std::vector<torch::Tensor> Trainer::all_gather(const torch::Tensor& tensor) {
  return plan_.strategy ? plan_.strategy->all_gather(tensor) : std::vector<torch::Tensor>{tensor};
}

c10::IValue Trainer::broadcast(const c10::IValue& value, int root) {
  return plan_.strategy ? plan_.strategy->broadcast(value, root) : value;
}

bool Trainer::any_rank(bool decision) {
  return plan_.strategy ? plan_.strategy->reduce_boolean_decision(decision, distributed::Decision::any) : decision;
}

void Trainer::log_metrics(const std::map<std::string, double>& metrics, int64_t step) {
  for (const auto& logger : loggers_) logger->log_metrics(metrics, step);
}

void Trainer::remove_checkpoint(const std::string& path) { checkpoint_io_->remove(path); }

std::string Trainer::log_dir() const { return log_dir_; }

std::map<std::string, double> Trainer::progress_bar_metrics() const {
  std::map<std::string, double> shown;
  for (const auto& [name, value] : callback_metrics_) {
    if (metrics_.on_progress_bar(name)) shown[name] = value;
  }
  // The bar shows every step's value, not only those of the logged steps (log_every_n_steps).
  for (const auto& [name, value] : metrics_.latest_step_values()) {
    if (metrics_.on_progress_bar(name)) shown[name] = value;
  }
  return shown;
}

void Trainer::add_default_callbacks() {
  if (options_.enable_progress_bar() && !has_callback<ProgressBar>(callbacks_)) {
    callbacks_.push_back(std::make_shared<ProgressBar>());
  }
  if (options_.enable_checkpointing() && !has_callback<ModelCheckpoint>(callbacks_)) {
    // save_last: so that --ckpt-path last finds <log_dir>/checkpoints/last.ckpt.
    callbacks_.push_back(std::make_shared<ModelCheckpoint>(ModelCheckpointOptions().save_last(true)));
  }
  // As Lightning: checkpoints are written after every other callback's epoch end, so that they
  // hold that epoch's state (EarlyStopping's count) and resume from it.
  std::stable_partition(callbacks_.begin(), callbacks_.end(),
                        [](const auto& c) { return dynamic_cast<ModelCheckpoint*>(c.get()) == nullptr; });
}

void Trainer::setup(const std::shared_ptr<TrainingModule>& module) {
  if (!module) throw UsageError("Trainer: the module is null; pass a std::shared_ptr to your TrainingModule.");
  if (!set_up_) {
    if (!profiler_) profiler_ = named_profiler(options_.profiler());  // first: a bad name launches nothing
    check_resume_source();
    check_init_weights_source();
    check_weights_match(*module);
    check_tuning_options();
    LOCKSTEP_CHECK(options_.accumulate_grad_batches() >= 1, UsageError, "--accumulate-grad-batches ",
                   options_.accumulate_grad_batches(), ": use 1 or more.");
    LOCKSTEP_CHECK(options_.check_val_every_n_epoch() >= 1, UsageError, "--check-val-every-n-epoch ",
                   options_.check_val_every_n_epoch(), ": use 1 or more (1 validates every epoch). To skip validation "
                   "use --limit-val-batches 0.");
    core::warn_if_reference_blas();
    if (options_.seed() >= 0) seed_everything(static_cast<uint64_t>(options_.seed()));
    apply_deterministic(options_);
    const int cuda = accelerators::cuda_device_count();
    plan_ = launch(resolve_plan(options_, environments::Environ::from_process(), user_strategy_, cuda,
                                accelerators::probe_cuda_device, user_environment_));
    core::tune_heap_for_training();  // every process of the job; a sharded strategy narrows it in setup
    at::globalContext().setBenchmarkCuDNN(options_.benchmark());
    note_benchmark();
    if (options_.fast_dev_run() > 0) suppress_for_fast_dev_run();
    choose_log_dir();
    set_up_ = true;
  }
  add_default_callbacks();  // here, before fit restores a checkpoint into them
  if (module_ == module) return;
  module_ = module;
  attach(*module_, this);
  load_init_weights();  // into the whole module, before a strategy wraps or shards it
  // Counted whole, before a sharded strategy leaves each rank a piece; printed when fit starts.
  model_summary_ = options_.enable_model_summary() && plan_.strategy->is_global_zero() ? model_summary(*module_) : "";
  plan_.strategy->module_to_device(*module_);
  plan_.precision.convert_module(*module_);
  plan_.strategy->setup_module(module_);
  optimizer_config_ = module_->configure_optimizers();
  if (optimizer_config_.optimizers.empty() && module_->automatic_optimization()) {
    throw UsageError("configure_optimizers returned no optimizer; return one, e.g. "
                     "std::make_shared<torch::optim::Adam>(parameters(), 1e-3).");
  }
  for (const auto& optimizer : optimizer_config_.optimizers) plan_.strategy->check_optimizer(*optimizer);
  check_schedulers();
  scaler_.reset();
  if (plan_.precision.scales_loss()) {
    // Manual optimization would need the scaler in the user's own loop (Fabric's territory).
    LOCKSTEP_CHECK(module_->automatic_optimization(), UsageError, "--precision ", plan_.precision.name(),
                   " scales the loss in the Trainer's own optimizer step, and this module optimizes manually. "
                   "Use --precision bf16-mixed or 32-true, or automatic optimization.");
    scaler_.emplace();
  }
}

void Trainer::choose_log_dir() {
  std::optional<int64_t> continued;
  if (!loggers_set_by_user_ && options_.fast_dev_run() == 0 && plan_.strategy->is_global_zero()) {
    continued = continued_version();
    loggers_.push_back(std::make_shared<loggers::CSVLogger>(
        loggers::LoggerOptions(options_.default_root_dir()).version(continued)));
  }
  // Every rank needs the run directory (checkpoints), which rank 0's logger chose. Only rank 0
  // asks its logger: asking claims a new version_N directory (or the continued one).
  const bool ask_logger = !loggers_.empty() && plan_.strategy->is_global_zero();
  const std::string mine = ask_logger ? loggers_.front()->log_dir() : options_.default_root_dir();
  if (ask_logger && !continued) claimed_run_dir_ = mine;
  log_dir_ = plan_.strategy->broadcast(c10::IValue(mine), 0).toStringRef();
}

void Trainer::note_benchmark() const {
  if (!options_.benchmark() || !plan_.strategy->is_global_zero()) return;
  if (plan_.context.accelerator != accelerators::Accelerator::cuda) {
    std::cerr << "lockstep: --benchmark true has no effect on the CPU: it lets cuDNN time and pick convolution "
                 "algorithms on CUDA devices.\n";
  } else if (options_.deterministic()) {
    std::cerr << "lockstep: --benchmark true with --deterministic true: cuDNN times only its deterministic "
                 "convolution algorithms.\n";
  }
}

void Trainer::attach_sampler(DataLoader& loader, bool shuffle) {
  if (options_.use_distributed_sampler()) strategies::add_distributed_sampler(*plan_.strategy, loader, shuffle);
}

void Trainer::attach_evaluation_sampler(DataLoader& loader, const std::string& stage) {
  if (!options_.use_distributed_sampler() || !strategies::add_distributed_sampler(*plan_.strategy, loader, false)) return;
  const auto& sampler = *loader.sampler();
  const int64_t examples = loader.dataset()->size(), padded = sampler.total_size();
  if (padded == examples || !plan_.strategy->is_global_zero()) return;
  // As PyTorch's sampler pads; the evaluation loop leaves the repeats out of the metrics.
  std::cerr << "lockstep: " << stage << " on " << sampler.options().num_replicas() << " ranks: the DistributedSampler "
            << "pads " << examples << " examples to " << padded << " (" << sampler.num_samples() << " a rank) by "
            << "repeating " << padded - examples << "; the repeats run but count nothing in the " << stage
            << " metrics.\n";
}

void Trainer::attach_fit_samplers(DataLoader& train, DataLoader* val) {
  const bool overfit = overfitting(options_);
  attach_sampler(train, train.options().shuffle() && !overfit);
  if (val) attach_evaluation_sampler(*val, "validation");
  if (!overfit) return;
  // As Lightning, the same batches every epoch: a loader that shuffles is read in order instead.
  for (DataLoader* loader : {&train, val}) {
    if (loader == nullptr || !loader->options().shuffle()) continue;
    if (!loader->has_sampler()) {
      loader->set_sampler(std::make_shared<distributed::DistributedSampler>(
          loader->dataset()->size(), distributed::SamplerOptions(1, 0).shuffle(false)));
    }
    if (plan_.strategy->is_global_zero()) {
      std::cerr << "lockstep: --overfit-batches " << options_.overfit_batches().str() << ": the "
                << (loader == &train ? "training" : "validation") << " loader shuffles; it is read in order, so that "
                << "every epoch sees the same batches.\n";
    }
  }
}

void Trainer::log(const std::string& name, double value, const LogOptions& options) {
  if (sanity_checking_) return;
  metrics_.log(name, value, options, [this](double v) {
    auto t = plan_.strategy->all_reduce(torch::tensor({v}, torch::kFloat64), distributed::ReduceOp::mean);
    return t.item<double>();
  });
}

void Trainer::manual_backward(const torch::Tensor& loss) { plan_.strategy->manual_backward(loss); }

void Trainer::fit(const std::shared_ptr<TrainingModule>& module, DataModule& data) {
  fit(module, data.train_dataloader(), data.val_dataloader());
}

std::map<std::string, double> Trainer::validate(const std::shared_ptr<TrainingModule>& module, DataModule& data) {
  return validate(module, stage_loader(data.val_dataloader(), "val_dataloader"));
}

std::map<std::string, double> Trainer::test(const std::shared_ptr<TrainingModule>& module, DataModule& data) {
  return test(module, stage_loader(data.test_dataloader(), "test_dataloader"));
}

std::vector<torch::Tensor> Trainer::predict(const std::shared_ptr<TrainingModule>& module, DataModule& data,
                                            PredictOptions options) {
  return predict(module, stage_loader(data.predict_dataloader(), "predict_dataloader"), options);
}

void Trainer::fit(const std::shared_ptr<TrainingModule>& module, const std::shared_ptr<DataLoader>& train,
                  const std::shared_ptr<DataLoader>& val) {
  try {
    run_fit(module, train, val);
  } catch (const Error& e) {
    notify_exception(e);
    remove_empty_run_folder();
    // On local rank 0 of a job it launched: end the workers now, before this rank's process group
    // goes away and their failures could be taken for the cause.
    launchers::end_launched_job(e.exit_code());
    throw;
  } catch (const std::exception& e) {
    notify_exception(e);
    remove_empty_run_folder();
    launchers::end_launched_job(1);
    throw;
  } catch (...) {
    notify_exception(Error(ErrorKind::training, "fit ended by an exception that is not a std::exception"));
    remove_empty_run_folder();
    launchers::end_launched_job(1);
    throw;
  }
}

void Trainer::notify_exception(const std::exception& error) {
  if (!std::exchange(fit_started_, false)) return;
  for (auto& callback : callbacks_) {
    try {
      callback->on_exception(*this, *module_, error);
    } catch (const std::exception& hook_error) {
      std::cerr << "lockstep: " << callback->name() << ".on_exception failed (" << hook_error.what()
                << "); the error that ended fit follows.\n";
    }
  }
}

void Trainer::remove_empty_run_folder() noexcept {
  // Only the folder this run's loggers made: --default-root-dir itself is the user's.
  if (claimed_run_dir_.empty()) return;
  namespace fs = std::filesystem;
  std::error_code error;
  for (fs::recursive_directory_iterator it(claimed_run_dir_, error), end; !error && it != end; it.increment(error)) {
    if (!it->is_directory(error)) return;  // something was written: the folder stays
  }
  if (!error) fs::remove_all(claimed_run_dir_, error);
}

void Trainer::run_fit(const std::shared_ptr<TrainingModule>& module, const std::shared_ptr<DataLoader>& train,
                      const std::shared_ptr<DataLoader>& val) {
  if (!train) throw UsageError("Trainer::fit needs a training DataLoader; it was null.");
  const auto started = std::chrono::steady_clock::now();
  setup(module);
  if (!model_summary_.empty()) std::cerr << std::exchange(model_summary_, std::string());
  attach_fit_samplers(*train, val.get());
  tune_for_fit(train);  // --scale-batch-size, --lr-find: before the epoch's length is known
  // Checked before any hook runs, so that a bad interval stops the run before it writes anything.
  num_training_batches_ = options_.limit_train_batches().of(train->num_batches());
  val_check_batch_ = resolve_val_check_batch(options_.val_check_interval(), num_training_batches_);
  // From here every rank stops at the same step when one is signalled (Ctrl-C included) or gets a
  // loss that is not finite; the previous signal handlers come back when fit ends.
  distributed::AgreedStop agreed_stop(plan_.strategy->group(), {SIGINT, SIGTERM, SIGUSR1});
  agreed_stop_ = &agreed_stop;
  stop_request_.reset();
  fit_train_ = train.get();
  struct Forget {
    distributed::AgreedStop*& stop;
    DataLoader*& train;
    ~Forget() { stop = nullptr, train = nullptr; }
  } forget{agreed_stop_, fit_train_};
  std::optional<torch::autograd::DetectAnomalyGuard> anomaly_mode;
  if (options_.detect_anomaly()) anomaly_mode.emplace();
  ProfiledStage profiled(profiler_.get(), "fit", plan_.strategy->global_rank(), log_dir_);
  const bool resuming = !options_.ckpt_path().empty() && restore(options_.ckpt_path());
  start_attempt_record(resuming);
  if (plan_.strategy->is_global_zero()) {
    for (auto& logger : loggers_) logger->log_hyperparams(module_->hparams());
    if (!loggers_.empty()) save_program_config(log_dir_);
  }
  module_->on_fit_start();
  each_callback("on_fit_start", [&](Callback& c) { c.on_fit_start(*this, *module_); });
  fit_started_ = true;
  if (val && !resuming) run_sanity_check(*val);
  int64_t max_epochs = options_.max_epochs();
  if (max_epochs < 0) max_epochs = options_.max_steps() < 0 ? 1000 : std::numeric_limits<int64_t>::max();
  should_stop_ = false;
  const int64_t first_epoch = current_epoch_, first_step = global_step_;
  while (current_epoch_ < max_epochs && !should_stop_) {
    if (options_.max_steps() >= 0 && global_step_ >= options_.max_steps()) break;
    run_training_epoch(*train, val.get());
    if (stop_request_) end_stopped_fit(*stop_request_);
    ++current_epoch_;
    epoch_completed_ = false;
    batches_done_ = 0;
  }
  fit_started_ = false;
  if (current_epoch_ == first_epoch && global_step_ == first_step && plan_.strategy->is_global_zero()) {
    std::cerr << "lockstep: warning: fit trained nothing: " << why_nothing_trained(first_epoch, max_epochs) << "\n";
  }
  // The steps not yet logged belong to the last epoch that ran.
  emit_step_metrics(true, std::max<int64_t>(0, current_epoch_ - 1));
  module_->on_fit_end();
  each_callback("on_fit_end", [&](Callback& c) { c.on_fit_end(*this, *module_); });
  for (auto& logger : loggers_) logger->finalize("success");
  profiled.end();  // before the barrier: every rank's trace is written when rank 0 names them
  plan_.strategy->barrier("fit_end");
  if (profiler_ && plan_.strategy->is_global_zero()) std::cerr << profiler_->summary() << std::flush;
  print_fit_end(std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
}

void Trainer::run_sanity_check(DataLoader& val) {
  // At most --limit-val-batches batches, as Lightning; -1: that many.
  const int64_t limit = options_.limit_val_batches().of(val.num_batches()), asked = options_.num_sanity_val_steps();
  if (asked == 0) return;
  sanity_checking_ = true;
  run_evaluation(val, Phase::validation, asked < 0 ? limit : std::min(asked, limit));
  sanity_checking_ = false;
}

std::map<std::string, double> Trainer::validate(const std::shared_ptr<TrainingModule>& module,
                                                const std::shared_ptr<DataLoader>& loader) {
  if (!loader) throw UsageError("Trainer::validate needs a DataLoader; it was null.");
  setup(module);
  attach_evaluation_sampler(*loader, "validation");
  num_val_batches_ = options_.limit_val_batches().of(loader->num_batches());
  return run_evaluation(*loader, Phase::validation, num_val_batches_);
}

std::map<std::string, double> Trainer::test(const std::shared_ptr<TrainingModule>& module,
                                            const std::shared_ptr<DataLoader>& loader) {
  if (!loader) throw UsageError("Trainer::test needs a DataLoader; it was null.");
  setup(module);
  attach_evaluation_sampler(*loader, "test");
  return run_evaluation(*loader, Phase::test,
                        options_.limit_test_batches().of(loader->num_batches()));
}

void Trainer::print_fit_end(double seconds) {
  if (!plan_.strategy->is_global_zero()) return;
  nlohmann::json line{{"event", "fit_end"},
                      {"epoch", current_epoch_},
                      {"global_step", global_step_},
                      {"world_size", plan_.strategy->world_size()},
                      {"seconds", seconds},
                      {"log_dir", log_dir_},
                      {"metrics", callback_metrics_}};
  std::cout << line.dump() << std::endl;
}

}  // namespace lockstep
