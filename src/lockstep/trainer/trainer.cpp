#include <lockstep/trainer/trainer.h>

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>

#include <ATen/autocast_mode.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <lockstep/accelerators/device_parser.h>
#include <lockstep/callbacks/model_checkpoint.h>
#include <lockstep/callbacks/progress_bar.h>
#include <lockstep/callbacks/simple_profiler.h>
#include <lockstep/checkpoint/checkpoint_io.h>
#include <lockstep/core/number_text.h>
#include <lockstep/checkpoint/optimizer_state.h>
#include <lockstep/checkpoint/state_dict.h>
#include <lockstep/core/blas.h>
#include <lockstep/core/seed.h>
#include <lockstep/core/usage_error.h>
#include <lockstep/distributed/rank_zero.h>
#include <lockstep/launchers/launcher.h>
#include <lockstep/loggers/csv_logger.h>

namespace lockstep {
namespace {

// "1.0" (all), "0.25" (a fraction), "10" (a count) of `available` batches.
int64_t limit_batches(const std::string& limit, int64_t available, const std::string& flag) {
  const auto parsed = whole_number(limit);
  const double value = parsed.value_or(-1);
  if (value < 0) {
    throw UsageError("--" + flag + " '" + limit + "' is neither a fraction (0.25) nor a batch count (10).");
  }
  if (limit.find('.') != std::string::npos || limit.find('e') != std::string::npos) {
    if (value > 1.0) {
      throw UsageError("--" + flag + " " + limit + ": a fraction must be at most 1.0; for a count write an integer.");
    }
    return static_cast<int64_t>(std::floor(value * static_cast<double>(available)));
  }
  return std::min<int64_t>(static_cast<int64_t>(value), available);
}

std::shared_ptr<DataLoader> stage_loader(std::shared_ptr<DataLoader> loader, const std::string& hook) {
  if (!loader) {
    throw UsageError("DataModule::" + hook + "() returned no loader (the default); override it in your DataModule "
                     "to use the DataModule for this stage.");
  }
  return loader;
}

// Lightning's val_check_batch: validate after every this many training batches of an epoch.
// "0.25" is a fraction of the epoch's `batches`, "10" a count; both must fit in the epoch.
int64_t resolve_val_check_batch(const std::string& interval, int64_t batches) {
  const auto parsed = whole_number(interval);
  const double value = parsed.value_or(0);
  if (!parsed || !std::isfinite(value)) {
    throw UsageError("--val-check-interval '" + interval +
                     "' is neither a fraction of the training epoch (0.25) nor a number of training batches (100).");
  }
  if (interval.find_first_of(".eE") != std::string::npos) {
    if (value <= 0 || value > 1.0) {
      throw UsageError("--val-check-interval " + interval + ": a fraction of the training epoch must be in (0, 1] "
                       "(e.g. 0.25 validates four times an epoch); for every N batches write an integer. To skip "
                       "validation use --limit-val-batches 0.");
    }
    return std::max<int64_t>(1, static_cast<int64_t>(std::floor(value * static_cast<double>(batches))));
  }
  if (value < 1) {
    throw UsageError("--val-check-interval " + interval + ": a number of training batches must be at least 1 "
                     "(e.g. 100, or a fraction such as 0.5). To skip validation use --limit-val-batches 0.");
  }
  if (batches > 0 && value > static_cast<double>(batches)) {
    throw UsageError("--val-check-interval " + interval + " but a training epoch has only " + std::to_string(batches) +
                     " batch(es) (after --limit-train-batches and the sampler). Use at most " +
                     std::to_string(batches) + ", or a fraction such as 0.5.");
  }
  return static_cast<int64_t>(value);
}

// Autocast on CPU for bf16-mixed, for the duration of one step.
class PrecisionScope {
 public:
  explicit PrecisionScope(const std::string& precision) : active_(precision == "bf16-mixed") {
    if (!active_) return;
    previous_dtype_ = at::autocast::get_autocast_cpu_dtype();
    at::autocast::set_cpu_enabled(true);
    at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
    at::autocast::increment_nesting();
  }
  ~PrecisionScope() {
    if (!active_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_cpu_enabled(false);
    at::autocast::set_autocast_cpu_dtype(previous_dtype_);
  }

 private:
  bool active_;
  at::ScalarType previous_dtype_ = at::kBFloat16;
};

void to_double(Batch& batch) {
  if (batch.data.defined() && batch.data.is_floating_point()) batch.data = batch.data.to(torch::kFloat64);
  if (batch.target.defined() && batch.target.is_floating_point()) batch.target = batch.target.to(torch::kFloat64);
}

template <typename T>
bool has_callback(const std::vector<std::shared_ptr<Callback>>& callbacks) {
  return std::any_of(callbacks.begin(), callbacks.end(), [](const auto& c) { return dynamic_cast<T*>(c.get()) != nullptr; });
}

// Once, in the process that launches the others.
void warn_if_ranks_outnumber_cores(const ExecutionPlan& plan) {
  if (plan.accelerator != "cpu") return;
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  if (::sched_getaffinity(0, sizeof(cpus), &cpus) != 0) return;
  const int cores = CPU_COUNT(&cpus);
  if (plan.devices_per_node <= cores) return;
  std::cerr << "lockstep: warning: --devices " << plan.devices_per_node << " starts " << plan.devices_per_node
            << " processes on " << cores << " CPU core(s): the ranks share cores and every step waits for the "
            << "slowest, so the job runs slower than with --devices " << cores << ".\n";
}

// `--ckpt-path last`: the newest version_N/checkpoints/last.ckpt in the folder of the runs
// (as Lightning's "last" finds the latest run's).
std::string find_last_checkpoint(const std::filesystem::path& runs) {
  std::string best;
  int64_t best_version = -1;
  std::error_code ignored;
  for (const auto& entry : std::filesystem::directory_iterator(runs, ignored)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("version_", 0) != 0) continue;
    const auto candidate = entry.path() / "checkpoints" / "last.ckpt";
    int64_t version = -1;
    try {
      version = std::stoll(name.substr(8));
    } catch (const std::exception&) {
      continue;
    }
    if (version > best_version && std::filesystem::exists(candidate)) {
      best_version = version;
      best = candidate.string();
    }
  }
  if (best.empty()) {
    throw UsageError("--ckpt-path last: no version_N/checkpoints/last.ckpt under " + runs.string() +
                     "; give the path of a checkpoint, or train once first (ModelCheckpoint writes last.ckpt).");
  }
  return best;
}

c10::IValue rng_state() {
  auto generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

}  // namespace

Trainer::Trainer(TrainerOptions options)
    : options_(std::move(options)), checkpoint_io_(std::make_shared<checkpoint::CheckpointIO>()) {}
Trainer::~Trainer() {
  if (module_) attach(*module_, nullptr);
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

template <typename Fn>
void Trainer::each_callback(const char* hook, Fn&& fn) {
  for (auto& callback : callbacks_) {
    if (!profiler_) {
      fn(*callback);
      continue;
    }
    auto timed = profile("[Callback]" + callback->name() + "." + hook);
    fn(*callback);
  }
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
    check_resume_source();
    core::warn_if_reference_blas();
    if (options_.seed() >= 0) seed_everything(static_cast<uint64_t>(options_.seed()));
    if (options_.deterministic()) at::globalContext().setDeterministicAlgorithms(true, false);
    const int cuda = accelerators::cuda_device_count();
    plan_ = resolve_plan(options_, environments::Environ::from_process(), user_strategy_, cuda);
    if (options_.auto_select_gpus() && plan_.accelerator == "cuda") {
      // The processes launched next (and this one's second resolve) use this pick, not a new probe.
      std::string ids;
      for (int id : plan_.gpu_ids) ids += (ids.empty() ? "" : ",") + std::to_string(id);
      ::setenv(kSelectedGpusVariable, ids.c_str(), 1);
    }
    if (auto launcher = plan_.strategy->launcher()) {
      warn_if_ranks_outnumber_cores(plan_);
      launcher->launch();  // returns in every local process, each with its rank's variables set
      plan_ = resolve_plan(options_, environments::Environ::from_process(), plan_.strategy, cuda);
    }
    plan_.strategy->setup_environment();
    distributed::set_global_rank(plan_.strategy->global_rank());
    at::globalContext().setBenchmarkCuDNN(options_.benchmark());
    if (options_.benchmark() && plan_.accelerator != "cuda" && plan_.strategy->is_global_zero()) {
      std::cerr << "lockstep: --benchmark true has no effect on the CPU: it lets cuDNN time and pick convolution "
                   "algorithms on CUDA devices.\n";
    }
    if (options_.profiler() && !profiler_) profiler_ = std::make_shared<SimpleProfiler>();
    if (!loggers_set_by_user_ && plan_.strategy->is_global_zero()) {
      loggers_.push_back(std::make_shared<loggers::CSVLogger>(loggers::LoggerOptions(options_.default_root_dir())));
    }
    // Every rank needs the run directory (checkpoints), which rank 0's logger chose. Only rank 0
    // asks its logger: asking claims a new version_N directory.
    const bool ask_logger = !loggers_.empty() && plan_.strategy->is_global_zero();
    const std::string mine = ask_logger ? loggers_.front()->log_dir() : options_.default_root_dir();
    log_dir_ = plan_.strategy->broadcast(c10::IValue(mine), 0).toStringRef();
    set_up_ = true;
  }
  add_default_callbacks();  // here, before fit restores a checkpoint into them
  if (module_ == module) return;
  module_ = module;
  attach(*module_, this);
  plan_.strategy->module_to_device(*module_);
  if (plan_.precision == "64-true") module_->to(torch::kFloat64);
  plan_.strategy->setup_module(module_);
  optimizer_config_ = module_->configure_optimizers();
  if (optimizer_config_.optimizers.empty() && module_->automatic_optimization()) {
    throw UsageError("configure_optimizers returned no optimizer; return one, e.g. "
                     "std::make_shared<torch::optim::Adam>(parameters(), 1e-3).");
  }
}

void Trainer::attach_sampler(DataLoader& loader, bool shuffle) {
  const auto kwargs = plan_.strategy->distributed_sampler_kwargs();
  if (!kwargs || !options_.use_distributed_sampler() || loader.has_sampler()) return;
  loader.set_sampler(std::make_shared<distributed::DistributedSampler>(
      loader.dataset()->size(), distributed::SamplerOptions(kwargs->first, kwargs->second)
                                    .shuffle(shuffle)
                                    .seed(loader.options().seed())
                                    .drop_last(false)));
}

void Trainer::log(const std::string& name, double value, const LogOptions& options) {
  if (sanity_checking_) return;
  metrics_.log(name, value, options, [this, &name](double v) {
    auto t = plan_.strategy->all_reduce(torch::tensor({v}, torch::kFloat64), distributed::ReduceOp::mean);
    return t.item<double>();
  });
}

void Trainer::manual_backward(const torch::Tensor& loss) { plan_.strategy->manual_backward(loss); }

torch::Tensor Trainer::run_step(const std::function<torch::Tensor()>& step) {
  PrecisionScope scope(plan_.precision);
  return step();
}

void Trainer::emit(const std::map<std::string, double>& metrics, std::optional<int64_t> epoch) {
  if (metrics.empty() || !plan_.strategy->is_global_zero()) return;
  std::map<std::string, double> row;
  for (const auto& [name, value] : metrics) {
    if (metrics_.to_logger(name)) row[name] = value;
  }
  if (row.empty()) return;
  row["epoch"] = static_cast<double>(epoch.value_or(current_epoch_));
  for (auto& logger : loggers_) logger->log_metrics(row, global_step_);
}

void Trainer::emit_step_metrics(bool force, std::optional<int64_t> epoch) {
  if (!force && global_step_ % options_.log_every_n_steps() != 0) return;
  auto values = metrics_.take_step_values();
  for (const auto& [name, value] : values) callback_metrics_[name] = value;
  emit(values, epoch);
}

void Trainer::optimizer_step() {
  if (options_.gradient_clip_val() > 0) {
    auto params = module_->parameters();
    if (options_.gradient_clip_algorithm() == "value") {
      torch::nn::utils::clip_grad_value_(params, options_.gradient_clip_val());
    } else {
      torch::nn::utils::clip_grad_norm_(params, options_.gradient_clip_val());
    }
  }
  each_callback("on_before_optimizer_step", [&](Callback& c) { c.on_before_optimizer_step(*this, *module_); });
  auto timed = profile("optimizer_step");
  for (auto& optimizer : optimizer_config_.optimizers) {
    optimizer->step();
    optimizer->zero_grad();
  }
  ++global_step_;
  for (auto& s : optimizer_config_.schedulers) {
    if (s.interval == "step") s.scheduler->step();
  }
  if (!optimizer_config_.schedulers.empty()) ++scheduler_step_steps_;
}

std::map<std::string, double> Trainer::run_evaluation(DataLoader& loader, Phase phase, int64_t max_batches) {
  auto timed = profile(phase == Phase::test ? "test" : "validation");
  torch::NoGradGuard no_grad;
  module_->eval();
  const Phase outer_phase = metrics_.phase();  // train, when validating within a training epoch
  metrics_.begin_epoch(phase);
  if (phase == Phase::validation) {
    module_->on_validation_epoch_start();
    each_callback("on_validation_start", [&](Callback& c) { c.on_validation_start(*this, *module_); });
  }
  const auto device = plan_.strategy->root_device();
  for (int64_t i = 0; i < max_batches; ++i) {
    Batch batch = [&] {
      auto fetch = profile(phase == Phase::test ? "test_dataloader_next" : "val_dataloader_next");
      return loader.batch(i);
    }();
    module_->transfer_batch_to_device(batch, device);
    if (plan_.precision == "64-true") to_double(batch);
    metrics_.set_batch_size(batch.size());
    auto step = profile(phase == Phase::test ? "test_step" : "validation_step");
    run_step([&] {
      if (phase == Phase::test) {
        module_->test_step(batch, i);
      } else {
        module_->validation_step(batch, i);
      }
      return torch::Tensor();
    });
    step.stop();
    if (phase == Phase::validation) {
      each_callback("on_validation_batch_end", [&](Callback& c) { c.on_validation_batch_end(*this, *module_, i); });
    }
  }
  if (phase == Phase::validation) module_->on_validation_epoch_end();
  if (phase == Phase::test) module_->on_test_epoch_end();
  auto values = metrics_.end_epoch(*plan_.strategy);
  metrics_.set_phase(outer_phase);
  module_->train();
  if (sanity_checking_) return {};
  for (const auto& [name, value] : values) callback_metrics_[name] = value;
  emit(values);
  if (phase == Phase::validation) each_callback("on_validation_end", [&](Callback& c) { c.on_validation_end(*this, *module_); });
  if (phase == Phase::test) each_callback("on_test_end", [&](Callback& c) { c.on_test_end(*this, *module_); });
  return values;
}

void Trainer::run_training_epoch(DataLoader& train, DataLoader* val) {
  auto timed_epoch = profile("run_training_epoch");
  train.set_epoch(current_epoch_);
  module_->train();
  metrics_.begin_epoch(Phase::train);
  // Before the hooks, so that callbacks (the progress bar) know the epoch's length.
  num_training_batches_ = limit_batches(options_.limit_train_batches(), train.num_batches(), "limit-train-batches");
  module_->on_train_epoch_start();
  each_callback("on_train_epoch_start", [&](Callback& c) { c.on_train_epoch_start(*this, *module_); });
  const int64_t accumulate = options_.accumulate_grad_batches();
  const bool automatic = module_->automatic_optimization();
  const auto device = plan_.strategy->root_device();
  const bool validate_this_epoch = val != nullptr && (current_epoch_ + 1) % options_.check_val_every_n_epoch() == 0;
  int64_t batches_run = 0;
  int64_t validated_after = -1;  // batches run when validation last ran in this epoch
  for (int64_t i = 0; i < num_training_batches_; ++i) {
    if (options_.max_steps() >= 0 && global_step_ >= options_.max_steps()) break;
    Batch batch = [&] {
      auto fetch = profile("train_dataloader_next");
      return train.batch(i);
    }();
    auto transfer = profile("transfer_batch_to_device");
    module_->transfer_batch_to_device(batch, device);
    transfer.stop();
    if (plan_.precision == "64-true") to_double(batch);
    metrics_.set_batch_size(batch.size());
    const bool step_now = (i + 1) % accumulate == 0 || i + 1 == num_training_batches_;
    if (automatic) plan_.strategy->set_gradient_sync(step_now);
    torch::Tensor loss = run_step([&] {
      auto timed = profile("training_step");
      return plan_.strategy->training_step(*module_, batch, i);
    });
    if (automatic && loss.defined()) {
      auto backward = profile("backward");
      plan_.strategy->backward(accumulate > 1 ? loss / static_cast<double>(accumulate) : loss);
      backward.stop();
      if (step_now) optimizer_step();
    } else if (!automatic) {
      ++global_step_;
    }
    module_->on_train_batch_end(loss, batch, i);
    each_callback("on_train_batch_end", [&](Callback& c) { c.on_train_batch_end(*this, *module_, loss, i); });
    emit_step_metrics(false);
    batches_run = i + 1;
    // Within the epoch only; validation after the last batch runs below, after the epoch metrics.
    if (validate_this_epoch && batches_run % val_check_batch_ == 0 && batches_run < num_training_batches_) {
      run_validation(*val);
      validated_after = batches_run;
      // EarlyStopping may ask to stop here; every rank must leave the epoch at the same batch.
      should_stop_ = plan_.strategy->reduce_boolean_decision(should_stop_, distributed::Decision::any);
      if (should_stop_) break;
    }
  }
  plan_.strategy->set_gradient_sync(true);
  module_->on_train_epoch_end();
  auto values = metrics_.end_epoch(*plan_.strategy);
  for (const auto& [name, value] : values) callback_metrics_[name] = value;
  emit(values);
  // A full epoch validates at its end when its last batch is a check batch (so "0.3" of 10
  // batches validates after 3, 6 and 9, as Lightning's); an epoch cut short by max_steps or a
  // stop validates once more unless it just did.
  const bool full_epoch = batches_run == num_training_batches_;
  if (validate_this_epoch &&
      (full_epoch ? num_training_batches_ % val_check_batch_ == 0 : validated_after != batches_run)) {
    run_validation(*val);
  }
  for (auto& s : optimizer_config_.schedulers) {
    if (s.interval == "epoch") s.scheduler->step();
  }
  if (!optimizer_config_.schedulers.empty()) ++scheduler_epoch_steps_;
  epoch_completed_ = true;  // checkpoints written from here on resume at the next epoch
  each_callback("on_train_epoch_end", [&](Callback& c) { c.on_train_epoch_end(*this, *module_); });
  // A stop requested on one rank (EarlyStopping agrees first, but a user hook may not) must stop all.
  should_stop_ = plan_.strategy->reduce_boolean_decision(should_stop_, distributed::Decision::any);
}

void Trainer::run_validation(DataLoader& val) {
  num_val_batches_ = limit_batches(options_.limit_val_batches(), val.num_batches(), "limit-val-batches");
  run_evaluation(val, Phase::validation, num_val_batches_);
}

void Trainer::fit(const std::shared_ptr<TrainingModule>& module, DataModule& data) {
  fit(module, data.train_dataloader(), data.val_dataloader());
}

std::map<std::string, double> Trainer::validate(const std::shared_ptr<TrainingModule>& module, DataModule& data) {
  return validate(module, stage_loader(data.val_dataloader(), "val_dataloader"));
}

std::map<std::string, double> Trainer::test(const std::shared_ptr<TrainingModule>& module, DataModule& data) {
  return test(module, stage_loader(data.test_dataloader(), "test_dataloader"));
}

std::vector<torch::Tensor> Trainer::predict(const std::shared_ptr<TrainingModule>& module, DataModule& data) {
  return predict(module, stage_loader(data.predict_dataloader(), "predict_dataloader"));
}

void Trainer::fit(const std::shared_ptr<TrainingModule>& module, const std::shared_ptr<DataLoader>& train,
                  const std::shared_ptr<DataLoader>& val) {
  try {
    run_fit(module, train, val);
  } catch (...) {
    // On local rank 0 of a job it launched: end the workers now, before this rank's process group
    // goes away and their failures could be taken for the cause.
    launchers::end_launched_job(1);
    throw;
  }
}

void Trainer::run_fit(const std::shared_ptr<TrainingModule>& module, const std::shared_ptr<DataLoader>& train,
                      const std::shared_ptr<DataLoader>& val) {
  if (!train) throw UsageError("Trainer::fit needs a training DataLoader; it was null.");
  const auto started = std::chrono::steady_clock::now();
  setup(module);
  attach_sampler(*train, train->options().shuffle());
  if (val) attach_sampler(*val, false);
  if (options_.check_val_every_n_epoch() < 1) {
    throw UsageError("--check-val-every-n-epoch " + std::to_string(options_.check_val_every_n_epoch()) +
                     ": use 1 or more (1 validates every epoch). To skip validation use --limit-val-batches 0.");
  }
  // Checked before any hook runs, so that a bad interval stops the run before it writes anything.
  num_training_batches_ = limit_batches(options_.limit_train_batches(), train->num_batches(), "limit-train-batches");
  val_check_batch_ = resolve_val_check_batch(options_.val_check_interval(), num_training_batches_);
  const bool resuming = !options_.ckpt_path().empty();
  if (resuming) restore(options_.ckpt_path());
  if (plan_.strategy->is_global_zero()) {
    nlohmann::json hparams(module_->hparams());
    for (auto& logger : loggers_) logger->log_hyperparams(hparams);
  }
  module_->on_fit_start();
  each_callback("on_fit_start", [&](Callback& c) { c.on_fit_start(*this, *module_); });
  if (val && options_.num_sanity_val_steps() > 0 && !resuming) {
    sanity_checking_ = true;
    run_evaluation(*val, Phase::validation, std::min(options_.num_sanity_val_steps(), val->num_batches()));
    sanity_checking_ = false;
  }
  int64_t max_epochs = options_.max_epochs();
  if (max_epochs < 0) max_epochs = options_.max_steps() < 0 ? 1000 : std::numeric_limits<int64_t>::max();
  should_stop_ = false;
  const int64_t first_epoch = current_epoch_, first_step = global_step_;
  while (current_epoch_ < max_epochs && !should_stop_) {
    if (options_.max_steps() >= 0 && global_step_ >= options_.max_steps()) break;
    run_training_epoch(*train, val.get());
    ++current_epoch_;
    epoch_completed_ = false;
  }
  if (current_epoch_ == first_epoch && global_step_ == first_step && plan_.strategy->is_global_zero()) {
    std::cerr << "lockstep: warning: fit trained nothing: " << why_nothing_trained(first_epoch, max_epochs) << "\n";
  }
  // The steps not yet logged belong to the last epoch that ran.
  emit_step_metrics(true, std::max<int64_t>(0, current_epoch_ - 1));
  module_->on_fit_end();
  each_callback("on_fit_end", [&](Callback& c) { c.on_fit_end(*this, *module_); });
  for (auto& logger : loggers_) logger->finalize("success");
  plan_.strategy->barrier("fit_end");
  if (profiler_ && plan_.strategy->is_global_zero()) std::cerr << profiler_->summary() << std::flush;
  print_fit_end(std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
}

std::map<std::string, double> Trainer::validate(const std::shared_ptr<TrainingModule>& module,
                                                const std::shared_ptr<DataLoader>& loader) {
  if (!loader) throw UsageError("Trainer::validate needs a DataLoader; it was null.");
  setup(module);
  attach_sampler(*loader, false);
  num_val_batches_ = limit_batches(options_.limit_val_batches(), loader->num_batches(), "limit-val-batches");
  return run_evaluation(*loader, Phase::validation, num_val_batches_);
}

std::map<std::string, double> Trainer::test(const std::shared_ptr<TrainingModule>& module,
                                            const std::shared_ptr<DataLoader>& loader) {
  if (!loader) throw UsageError("Trainer::test needs a DataLoader; it was null.");
  setup(module);
  attach_sampler(*loader, false);
  return run_evaluation(*loader, Phase::test,
                        limit_batches(options_.limit_test_batches(), loader->num_batches(), "limit-test-batches"));
}

std::vector<torch::Tensor> Trainer::predict(const std::shared_ptr<TrainingModule>& module,
                                            const std::shared_ptr<DataLoader>& loader) {
  if (!loader) throw UsageError("Trainer::predict needs a DataLoader; it was null.");
  setup(module);
  attach_sampler(*loader, false);
  torch::NoGradGuard no_grad;
  module_->eval();
  std::vector<torch::Tensor> outputs;
  const auto device = plan_.strategy->root_device();
  for (int64_t i = 0; i < loader->num_batches(); ++i) {
    Batch batch = loader->batch(i);
    module_->transfer_batch_to_device(batch, device);
    if (plan_.precision == "64-true") to_double(batch);
    outputs.push_back(run_step([&] { return module_->predict_step(batch, i); }));
  }
  module_->train();
  return outputs;
}

c10::impl::GenericDict Trainer::checkpoint_state() const {
  auto ckpt = checkpoint::make_checkpoint();
  ckpt.insert("state_dict", checkpoint::state_dict(*module_));
  c10::impl::GenericList optimizers(c10::AnyType::get());
  for (const auto& o : optimizer_config_.optimizers) optimizers.push_back(checkpoint::optimizer_state_dict(*o));
  ckpt.insert("optimizer_states", optimizers);
  c10::impl::GenericDict schedulers(c10::StringType::get(), c10::AnyType::get());
  schedulers.insert("epoch_steps", scheduler_epoch_steps_);
  schedulers.insert("step_steps", scheduler_step_steps_);
  ckpt.insert("lr_schedulers", schedulers);
  ckpt.insert("epoch", current_epoch_);
  ckpt.insert("global_step", global_step_);
  c10::impl::GenericDict loops(c10::StringType::get(), c10::AnyType::get());
  loops.insert("next_epoch", epoch_completed_ ? current_epoch_ + 1 : current_epoch_);
  ckpt.insert("loops", loops);
  c10::impl::GenericDict callbacks(c10::StringType::get(), c10::AnyType::get());
  for (const auto& c : callbacks_) callbacks.insert(c->name(), c->state_dict());
  ckpt.insert("callbacks", callbacks);
  ckpt.insert("rng_state", rng_state());
  c10::impl::GenericDict hparams(c10::StringType::get(), c10::AnyType::get());
  for (const auto& [k, v] : module_->hparams()) hparams.insert(k, v);
  ckpt.insert("hyper_parameters", hparams);
  ckpt.insert("lockstep_version", std::string("0.1.0"));
  // Where it came from: a run resumed from it links back, so its curves can be drawn as one.
  ckpt.insert("log_dir", std::filesystem::absolute(log_dir_).string());
  return ckpt;
}

void Trainer::save_checkpoint(const std::string& path) {
  auto timed = profile("save_checkpoint");
  if (plan_.strategy->is_global_zero()) checkpoint_io_->save(checkpoint_state(), path);
  plan_.strategy->barrier("save_checkpoint");
}

std::string Trainer::why_nothing_trained(int64_t epoch, int64_t max_epochs) const {
  const std::string from = options_.ckpt_path().empty()
                               ? ""
                               : "the checkpoint (--ckpt-path " + options_.ckpt_path() + ") ends at epoch " +
                                     std::to_string(epoch) + ", step " + std::to_string(global_step_) + ", which ";
  if (epoch >= max_epochs) {
    return (from.empty() ? std::string("") : from + "already reaches ") + "--max-epochs " +
           std::to_string(options_.max_epochs()) + ". Raise --max-epochs to train.";
  }
  if (options_.max_steps() >= 0 && global_step_ >= options_.max_steps()) {
    return (from.empty() ? std::string("") : from + "already reaches ") + "--max-steps " +
           std::to_string(options_.max_steps()) + ". Raise --max-steps to train.";
  }
  return "the loader gave no training batch (--limit-train-batches " + options_.limit_train_batches() +
         ", " + std::to_string(num_training_batches_) + " batch(es)). Check the dataset and the limit.";
}

void Trainer::record_resume(const std::string& path, const std::string& origin) const {
  if (!plan_.strategy->is_global_zero()) return;
  const auto here = std::filesystem::absolute(log_dir_);
  std::cerr << "lockstep: resuming from " << path << " (epoch " << current_epoch_ << ", step " << global_step_
            << "); this run writes its logs and checkpoints to " << here.string();
  if (!origin.empty() && std::filesystem::path(origin) != here) {
    // `lockstep plot` follows this link to draw the runs as one.
    std::error_code ignored;
    std::filesystem::create_directories(here, ignored);
    std::ofstream(here / "resumed_from") << origin << "\n";
    std::cerr << " (the run it resumes wrote to " << origin << "; `lockstep plot " << here.string()
              << "` draws both)";
  }
  std::cerr << ".\n";
}

void Trainer::check_resume_source() {
  // Before a run folder is made or a rank launched, so that a bad path is one message, once.
  const std::string& path = options_.ckpt_path();
  if (path.empty()) return;
  if (path != "last") {
    early_checkpoint_ = checkpoint_io_->load(path);  // restore() uses it: one read
    return;
  }
  // A user's logger may keep its runs elsewhere: restore() looks beside its run folder then.
  if (loggers_set_by_user_) return;
  find_last_checkpoint(std::filesystem::path(options_.default_root_dir()) / loggers::LoggerOptions("").name());
}

void Trainer::restore(const std::string& ckpt_path) {
  std::string path = ckpt_path;
  // This run has a new version folder: the newest last.ckpt beside it.
  if (path == "last") path = find_last_checkpoint(std::filesystem::path(log_dir_).parent_path());
  auto ckpt = early_checkpoint_ && path == options_.ckpt_path() ? *early_checkpoint_ : checkpoint_io_->load(path);
  early_checkpoint_.reset();
  checkpoint::require_keys(ckpt, {"state_dict", "optimizer_states", "epoch", "global_step", "loops"}, path);
  // A checkpoint of something else may have the keys but not their contents: LibTorch's type
  // errors become one message naming the key and what it should hold.
  const auto reading = [&](const char* key, const char* expected, const std::function<void()>& read) {
    try {
      read();
    } catch (const UsageError& e) {
      throw UsageError("checkpoint '" + path + "': " + e.what());
    } catch (const c10::Error& e) {
      const std::string why = e.what_without_backtrace();
      throw UsageError("checkpoint '" + path + "': \"" + key + "\" should hold " + expected + " (" +
                       why.substr(0, why.find('\n')) + "). It is not a checkpoint of this Trainer; pass one it " +
                       "wrote (--ckpt-path PATH, or --ckpt-path last).");
    }
  };
  reading("state_dict", "a dict of parameter and buffer names to tensors",
          [&] { checkpoint::load_state_dict(*module_, ckpt.at("state_dict").toGenericDict()); });
  c10::impl::GenericList optimizers(c10::AnyType::get());
  reading("optimizer_states", "a list of optimizer state dicts", [&] { optimizers = ckpt.at("optimizer_states").toList(); });
  if (optimizers.size() != optimizer_config_.optimizers.size()) {
    throw UsageError("--ckpt-path " + path + " holds " + std::to_string(optimizers.size()) +
                     " optimizer state(s) but configure_optimizers returned " +
                     std::to_string(optimizer_config_.optimizers.size()) + "; resume with the same model code.");
  }
  // Schedulers first: replaying their steps moves the learning rates, which the optimizer
  // states then set to the saved values exactly.
  if (ckpt.contains("lr_schedulers")) {
    reading("lr_schedulers", "a dict with integers epoch_steps and step_steps", [&] {
      const auto s = ckpt.at("lr_schedulers").toGenericDict();
      scheduler_epoch_steps_ = s.at("epoch_steps").toInt();
      scheduler_step_steps_ = s.at("step_steps").toInt();
    });
    for (auto& config : optimizer_config_.schedulers) {
      const int64_t n = config.interval == "step" ? scheduler_step_steps_ : scheduler_epoch_steps_;
      for (int64_t i = 0; i < n; ++i) config.scheduler->step();
    }
  }
  reading("optimizer_states", "a list of optimizer state dicts", [&] {
    for (size_t i = 0; i < optimizers.size(); ++i) {
      checkpoint::load_optimizer_state_dict(*optimizer_config_.optimizers[i], optimizers.get(i).toGenericDict());
    }
  });
  reading("loops", "a dict with the integer next_epoch",
          [&] { current_epoch_ = ckpt.at("loops").toGenericDict().at("next_epoch").toInt(); });
  reading("global_step", "an integer", [&] { global_step_ = ckpt.at("global_step").toInt(); });
  record_resume(path, ckpt.contains("log_dir") && ckpt.at("log_dir").isString() ? ckpt.at("log_dir").toStringRef() : "");
  if (ckpt.contains("callbacks")) {
    reading("callbacks", "a dict of callback names to their states", [&] {
      const auto states = ckpt.at("callbacks").toGenericDict();
      for (auto& c : callbacks_) {
        if (states.contains(c->name())) c->load_state_dict(states.at(c->name()));
      }
    });
  }
  if (ckpt.contains("rng_state")) {
    reading("rng_state", "the CPU generator's state (a byte tensor)", [&] {
      auto generator = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_state(ckpt.at("rng_state").toTensor());
    });
  }
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
