// The Tuner's searches (Lightning's lr_find and scale_batch_size), the training steps they run
// inside the Trainer, and the scope that undoes those steps exactly.
#include <lockstep/trainer/tuner.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <limits>
#include <mutex>
#include <new>
#include <sstream>
#include <tuple>

#include <torch/torch.h>

#include <lockstep/core/error.h>

#include "trainer_internal.h"

namespace lockstep {
namespace {

// Lightning's is_oom_error: the error types, and LibTorch's messages for memory it could not get.
bool is_out_of_memory(const std::exception& error) {
  if (dynamic_cast<const c10::OutOfMemoryError*>(&error) != nullptr) return true;
  if (dynamic_cast<const std::bad_alloc*>(&error) != nullptr) return true;
  if (dynamic_cast<const c10::Error*>(&error) == nullptr) return false;
  const std::string what = error.what();
  for (const char* words : {"out of memory", "not enough memory", "can't allocate memory"}) {
    if (what.find(words) != std::string::npos) return true;
  }
  return false;
}

// The learning rate of step k, as Lightning's _ExponentialLR and _LinearLR give it: the first
// step at min_lr, step k > 0 at the fraction (k + 1) / num_training of the way to max_lr.
double lr_at(const LRFinderOptions& o, int64_t k) {
  if (k == 0) return o.min_lr();
  const double r = static_cast<double>(k + 1) / static_cast<double>(o.num_training());
  if (o.mode() == "linear") return o.min_lr() + r * (o.max_lr() - o.min_lr());
  return o.min_lr() * std::pow(o.max_lr() / o.min_lr(), r);
}

void set_lr(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

std::string three_digits(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.3g", value);
  return text;
}

void check_lr_options(const LRFinderOptions& o) {
  LOCKSTEP_CHECK(o.min_lr() > 0 && o.max_lr() > o.min_lr(), UsageError, "LRFinderOptions: min_lr ", o.min_lr(),
                 ", max_lr ", o.max_lr(), ": the range test needs 0 < min_lr < max_lr (Lightning's 1e-8 and 1).");
  LOCKSTEP_CHECK(o.num_training() >= 2, UsageError, "LRFinderOptions: num_training ", o.num_training(),
                 ": use 2 steps or more (Lightning's default: 100).");
  LOCKSTEP_CHECK(o.mode() == "exponential" || o.mode() == "linear", UsageError, "LRFinderOptions: mode '", o.mode(),
                 "': use exponential or linear.");
  LOCKSTEP_CHECK(o.early_stop_threshold() >= 0, UsageError, "LRFinderOptions: early_stop_threshold ",
                 o.early_stop_threshold(), ": use a factor such as 4.0, or 0 never to stop early.");
  LOCKSTEP_CHECK(o.beta() >= 0 && o.beta() < 1, UsageError, "LRFinderOptions: beta ", o.beta(),
                 ": the smoothing weight lies in [0, 1) (Lightning's 0.98).");
}

void check_batch_options(const BatchSizeFinderOptions& o) {
  LOCKSTEP_CHECK(o.mode() == "power" || o.mode() == "binsearch", UsageError, "BatchSizeFinderOptions: mode '",
                 o.mode(), "': use power or binsearch.");
  LOCKSTEP_CHECK(o.steps_per_trial() >= 1 && o.init_val() >= 1 && o.max_trials() >= 1 && o.max_val() >= 1,
                 UsageError, "BatchSizeFinderOptions: steps_per_trial ", o.steps_per_trial(), ", init_val ",
                 o.init_val(), ", max_trials ", o.max_trials(), ", max_val ", o.max_val(),
                 ": each must be 1 or more (Lightning's defaults: 3, 2, 25, 8192).");
  LOCKSTEP_CHECK(o.margin() >= 0 && o.margin() < 1, UsageError, "BatchSizeFinderOptions: margin ", o.margin(),
                 ": a fraction in [0, 1) (Lightning's 0.05).");
}

using Trial = std::function<bool(int64_t)>;

[[noreturn]] void throw_no_size_fits() {
  throw UsageError("the batch-size finder: batch size 1 ran out of memory, so no batch size fits. Make room: a "
                   "smaller model, --precision bf16-mixed, or more devices with a sharded strategy (--strategy fsdp).");
}

// Lightning's power mode: double after every trial that ran; after one that did not, the last
// that ran (or half, while none has).
int64_t power_search(const Trial& runs, int64_t size, int64_t limit, int64_t max_trials) {
  int64_t last_ran = 0;
  for (int64_t i = 0; i < max_trials; ++i) {
    if (runs(size)) {
      last_ran = size;
      if (size >= limit) break;
      size = std::min(2 * size, limit);
      continue;
    }
    if (last_ran > 0) return last_ran;
    if (size == 1) throw_no_size_fits();
    size /= 2;
  }
  return last_ran > 0 ? last_ran : size;
}

// Lightning's binsearch mode: double until a trial does not run, then bisect between the largest
// size that ran (low) and the smallest that did not (high); max_trials counts the trials that ran.
int64_t binary_search(const Trial& runs, int64_t size, int64_t limit, int64_t max_trials) {
  int64_t low = 1, high = 0, ran = 0;
  while (true) {
    if (runs(size)) {
      if (++ran >= max_trials) return size;
      low = size;
      if (high > 0) {
        if (high - low <= 1) return size;
        size = (high + low) / 2;
      } else {
        if (size >= limit) return size;
        size = std::min(2 * size, limit);
      }
      continue;
    }
    if (size == 1) throw_no_size_fits();
    high = size;
    size = (high + low) / 2;
    if (high - low <= 1) return size;
  }
}

// An optimizer's per-parameter state (its archive: copies of every tensor) and each group's
// options (learning rate included, which LibTorch 1.13's load leaves as it is).
struct OptimizerCopy {
  std::string state;
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> options;
};

OptimizerCopy copy_of(const torch::optim::Optimizer& optimizer) {
  torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  std::ostringstream out;
  archive.save_to(out);
  OptimizerCopy copy{out.str(), {}};
  for (const auto& group : optimizer.param_groups()) copy.options.push_back(group.options().clone());
  return copy;
}

void load_copy(torch::optim::Optimizer& optimizer, const OptimizerCopy& copy) {
  optimizer.state().clear();  // load adds the saved states and would leave the steps' new ones
  torch::serialize::InputArchive archive;
  std::istringstream in(copy.state);
  archive.load_from(in);
  optimizer.load(archive);
  auto& groups = optimizer.param_groups();
  for (size_t i = 0; i < groups.size(); ++i) groups[i].set_options(copy.options[i]->clone());
}

}  // namespace

// Copies of everything the searches' steps change; the callbacks, loggers and schedulers stand
// aside meanwhile (as in Lightning, which gives the loop its own callback and no logger).
class Trainer::TuningScope {
 public:
  explicit TuningScope(Trainer& t)
      : t_(t),
        metrics_(t.metrics_),
        callback_metrics_(t.callback_metrics_),
        scaler_(t.scaler_),
        counters_{t.current_epoch_, t.global_step_, t.batches_done_, t.step_boundary_batch_,
                  t.num_training_batches_, t.scheduler_epoch_steps_, t.scheduler_step_steps_},
        epoch_completed_(t.epoch_completed_),
        should_stop_(t.should_stop_),
        training_(t.module_->is_training()) {
    torch::NoGradGuard no_grad;
    for (const auto& p : t.module_->parameters()) {
      tensors_.push_back(p.detach().clone());
      grads_.push_back(p.grad().defined() ? p.grad().detach().clone() : torch::Tensor());
    }
    for (const auto& b : t.module_->buffers()) tensors_.push_back(b.detach().clone());
    for (const auto& o : t.optimizer_config_.optimizers) optimizers_.push_back(copy_of(*o));
    auto generator = at::detail::getDefaultCPUGenerator();
    {
      std::lock_guard<std::mutex> lock(generator.mutex());
      rng_ = generator.get_state();
    }
    callbacks_ = std::exchange(t.callbacks_, {});
    loggers_ = std::exchange(t.loggers_, {});
    schedulers_ = std::exchange(t.optimizer_config_.schedulers, {});
  }
  TuningScope(const TuningScope&) = delete;
  TuningScope& operator=(const TuningScope&) = delete;
  ~TuningScope() {
    t_.callbacks_ = std::move(callbacks_);
    t_.loggers_ = std::move(loggers_);
    t_.optimizer_config_.schedulers = std::move(schedulers_);
  }

  /// Puts the weights, gradients, optimizer states, counters and generator back, bit for bit.
  void restore() {
    {
      torch::NoGradGuard no_grad;
      size_t i = 0;
      auto params = t_.module_->parameters();
      for (auto& p : params) restore_parameter(p, i++);
      for (auto& b : t_.module_->buffers()) b.copy_(tensors_[i++]);
    }
    for (size_t i = 0; i < optimizers_.size(); ++i) load_copy(*t_.optimizer_config_.optimizers[i], optimizers_[i]);
    auto generator = at::detail::getDefaultCPUGenerator();
    {
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_state(rng_);
    }
    t_.metrics_ = metrics_;
    t_.callback_metrics_ = callback_metrics_;
    t_.scaler_ = scaler_;
    std::tie(t_.current_epoch_, t_.global_step_, t_.batches_done_, t_.step_boundary_batch_, t_.num_training_batches_,
             t_.scheduler_epoch_steps_, t_.scheduler_step_steps_) = counters_;
    t_.epoch_completed_ = epoch_completed_;
    t_.should_stop_ = should_stop_;
    t_.plan_.strategy->set_gradient_sync(true);
    t_.module_->train(training_);
  }

 private:
  // In place where the gradient lives on (DDP's bucket views), else as it was: none, or a copy.
  void restore_parameter(torch::Tensor& p, size_t i) {
    p.copy_(tensors_[i]);
    const auto& grad = grads_[i];
    if (grad.defined() && p.grad().defined()) {
      p.mutable_grad().copy_(grad);
    } else {
      p.mutable_grad() = grad.defined() ? grad.clone() : torch::Tensor();
    }
  }

  Trainer& t_;
  MetricCollection metrics_;
  std::map<std::string, double> callback_metrics_;
  std::optional<GradScaler> scaler_;
  std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t> counters_;
  bool epoch_completed_, should_stop_, training_;
  std::vector<torch::Tensor> tensors_, grads_;  // parameters then buffers; parameters' gradients
  std::vector<OptimizerCopy> optimizers_;
  torch::Tensor rng_;
  std::vector<std::shared_ptr<Callback>> callbacks_;
  std::vector<std::shared_ptr<Logger>> loggers_;
  std::vector<SchedulerConfig> schedulers_;
};

int64_t Trainer::run_tuning_steps(DataLoader& train, int64_t steps, const std::function<void(int64_t)>& before,
                                  const std::function<bool(int64_t, double)>& after) {
  const bool automatic = module_->automatic_optimization();
  const int64_t accumulate = options_.accumulate_grad_batches();
  int64_t done = 0;
  for (int64_t epoch = current_epoch_; done < steps; ++epoch) {
    train.set_epoch(epoch);
    module_->train();
    metrics_.begin_epoch(Phase::train);
    const int64_t batches = options_.limit_train_batches().of(train.num_batches());
    LOCKSTEP_CHECK(batches > 0, UsageError, "the tuner trains on the training loader, and it gives no batch ",
                   "(--limit-train-batches ", options_.limit_train_batches().str(), ", ", train.num_batches(),
                   " batch(es)). Check the dataset and the limit.");
    num_training_batches_ = batches;
    for (int64_t i = 0; i < batches && done < steps; ++i) {
      const bool step_now = !automatic || (i + 1) % accumulate == 0 || i + 1 == batches;
      if (before) before(done);
      const torch::Tensor loss = run_training_batch(train, i, step_now, automatic);
      if (!step_now) continue;
      const int64_t k = done++;
      if (!after) continue;
      const double here = loss.defined() ? loss.detach().to(torch::kCPU, torch::kFloat64).item<double>()
                                         : std::numeric_limits<double>::quiet_NaN();
      const auto mean = plan_.strategy->all_reduce(torch::tensor({here}, torch::kFloat64), distributed::ReduceOp::mean);
      if (after(k, mean.item<double>())) return done;
    }
  }
  plan_.strategy->set_gradient_sync(true);
  return done;
}

void Trainer::check_tuning_options() const {
  const std::string& mode = options_.scale_batch_size();
  LOCKSTEP_CHECK(mode.empty() || mode == "power" || mode == "binsearch", UsageError, "--scale-batch-size ", mode,
                 ": use power (double until out of memory) or binsearch (then bisect to the largest size that fits).");
  if (options_.ckpt_path().empty() || (!options_.lr_find() && mode.empty())) return;
  const std::string given = options_.lr_find() ? "--lr-find" : "--scale-batch-size " + mode;
  throw UsageError(given + " tunes a run before it starts, and --ckpt-path " + options_.ckpt_path() + " resumes one "
                   "with the learning rate and batch size it had. Tune in the run's first fit, without --ckpt-path, "
                   "or drop " + given + ".");
}

void Trainer::tune_for_fit(const std::shared_ptr<DataLoader>& train) {
  if (!options_.lr_find() && options_.scale_batch_size().empty()) return;
  Tuner tuner(*this);
  // As Lightning's tune(): the batch size first, then the learning rate at that size.
  if (!options_.scale_batch_size().empty()) {
    tuner.find_batch_size(*train, BatchSizeFinderOptions().mode(options_.scale_batch_size()));
  }
  if (options_.lr_find()) {
    tuner.find_lr(*train, LRFinderOptions().csv_path((std::filesystem::path(log_dir_) / "lr_find.csv").string()));
  }
}

void Tuner::prepare(const std::shared_ptr<TrainingModule>& module, DataLoader& train) {
  trainer_.setup(module);
  if (!train.has_sampler()) trainer_.attach_fit_samplers(train, nullptr);
}

LRFinder Tuner::lr_find(const std::shared_ptr<TrainingModule>& module, const std::shared_ptr<DataLoader>& train,
                        LRFinderOptions options) {
  LOCKSTEP_CHECK(train, UsageError, "Tuner::lr_find needs a training DataLoader; it was null.");
  check_lr_options(options);
  prepare(module, *train);
  return find_lr(*train, options);
}

int64_t Tuner::scale_batch_size(const std::shared_ptr<TrainingModule>& module, const std::shared_ptr<DataLoader>& train,
                                BatchSizeFinderOptions options) {
  LOCKSTEP_CHECK(train, UsageError, "Tuner::scale_batch_size needs a training DataLoader; it was null.");
  check_batch_options(options);
  prepare(module, *train);
  return find_batch_size(*train, options);
}

LRFinder Tuner::find_lr(DataLoader& train, const LRFinderOptions& o) {
  Trainer& t = trainer_;
  check_lr_options(o);
  const bool zero = t.plan_.strategy->is_global_zero();
  if (t.options_.fast_dev_run() > 0) {
    if (zero) std::cerr << "lockstep: skipping the LR finder under --fast-dev-run.\n";
    return {};
  }
  const auto& optimizers = t.optimizer_config_.optimizers;
  LOCKSTEP_CHECK(optimizers.size() == 1, UsageError, "the LR finder sets the learning rate of one optimizer, and ",
                 "configure_optimizers returned ", optimizers.size(), ". Tune a module with one optimizer, or set ",
                 "the learning rates yourself.");
  auto& optimizer = *optimizers.front();
  LRFinder finder;
  finder.mode = o.mode();
  double average = 0, best = 0;
  {
    Trainer::TuningScope scope(t);
    // Lightning's _LRCallback: a running average, debiased with its global step (k + 1) plus one.
    t.run_tuning_steps(
        train, o.num_training(), [&](int64_t k) { set_lr(optimizer, lr_at(o, k)); },
        [&](int64_t k, double loss) {
          finder.lrs.push_back(lr_at(o, k));
          if (std::isnan(loss)) {  // a step that returned no loss: a point the suggestion skips
            finder.losses.push_back(loss);
            return false;
          }
          average = o.beta() * average + (1 - o.beta()) * loss;
          const double smoothed = average / (1 - std::pow(o.beta(), static_cast<double>(k + 2)));
          const bool diverged = !std::isfinite(smoothed) ||
                                (o.early_stop_threshold() > 0 && k > 0 && smoothed > o.early_stop_threshold() * best);
          if (smoothed < best || k == 0) best = smoothed;
          finder.losses.push_back(smoothed);
          return diverged;
        });
    scope.restore();
  }
  const auto suggestion = finder.suggestion();
  if (o.update_lr() && suggestion) set_lr(optimizer, *suggestion);
  if (zero && !o.csv_path().empty()) finder.write_csv(o.csv_path());
  report_lr(finder, o);
  return finder;
}

void Tuner::report_lr(const LRFinder& finder, const LRFinderOptions& o) const {
  if (!trainer_.plan_.strategy->is_global_zero()) return;
  const auto steps = static_cast<int64_t>(finder.lrs.size());
  std::cerr << "lockstep: LR finder: " << steps << " step(s) from " << three_digits(o.min_lr()) << " towards "
            << three_digits(o.max_lr()) << (steps < o.num_training() ? " (stopped early: the loss diverged)" : "");
  if (const auto index = finder.suggestion_index()) {
    std::cerr << "; suggested learning rate " << three_digits(finder.lrs[*index]) << " (step " << *index << ")"
              << (o.update_lr() ? ", set on the optimizer" : "");
  } else {
    std::cerr << "; no suggestion: fewer than 2 finite losses after the first 10 steps (give it more steps or data)";
  }
  if (!o.csv_path().empty()) std::cerr << ". `lockstep plot " << o.csv_path() << "` draws it";
  std::cerr << ".\n";
}

bool Tuner::run_trial(DataLoader& train, int64_t size, int64_t steps) {
  Trainer& t = trainer_;
  train.set_batch_size(size);
  bool out_of_memory = false;
  try {
    t.run_tuning_steps(train, steps, nullptr, nullptr);
  } catch (const std::exception& error) {
    if (!is_out_of_memory(error)) throw;
    out_of_memory = true;
    for (const auto& optimizer : t.optimizer_config_.optimizers) optimizer->zero_grad();
    t.plan_.strategy->set_gradient_sync(true);
  }
  return !t.any_rank(out_of_memory);
}

int64_t Tuner::find_batch_size(DataLoader& train, const BatchSizeFinderOptions& o) {
  Trainer& t = trainer_;
  check_batch_options(o);
  const bool zero = t.plan_.strategy->is_global_zero();
  if (t.options_.fast_dev_run() > 0) {
    if (zero) std::cerr << "lockstep: skipping the batch-size finder under --fast-dev-run.\n";
    return train.options().batch_size();
  }
  // A batch holds at most the examples a rank reads in an epoch.
  const int64_t examples = train.has_sampler() ? train.sampler()->num_samples() : train.dataset()->size();
  const int64_t limit = std::max<int64_t>(1, std::min(examples, o.max_val()));
  const int64_t first = std::min(o.init_val(), limit);
  std::string tried;
  int64_t found = 0;
  {
    Trainer::TuningScope scope(t);
    const Trial trial = [&](int64_t size) {
      const bool ran = run_trial(train, size, o.steps_per_trial());
      tried += (tried.empty() ? "" : ", ") + std::to_string(size) + (ran ? "" : " out of memory");
      return ran;
    };
    found = o.mode() == "power" ? power_search(trial, first, limit, o.max_trials())
                                : binary_search(trial, first, limit, o.max_trials());
    scope.restore();
  }
  if (o.mode() == "binsearch" && o.margin() > 0) {
    found = std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(found) * (1 - o.margin())));
  }
  train.set_batch_size(found);
  if (zero) {
    std::cerr << "lockstep: batch-size finder (" << o.mode() << "): tried " << tried << "; batch size " << found
              << (o.mode() == "binsearch" && o.margin() > 0 ? " (the boundary less a margin of " + three_digits(o.margin()) + ")" : "")
              << " set on the training loader.\n";
  }
  return found;
}

}  // namespace lockstep
