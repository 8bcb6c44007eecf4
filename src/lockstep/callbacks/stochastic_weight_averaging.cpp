#include <lockstep/callbacks/stochastic_weight_averaging.h>

#include <cmath>

#include <torch/torch.h>

#include <lockstep/core/error.h>
#include <lockstep/core/training_module.h>

namespace lockstep {
namespace {

// The module's batch norm layers' running statistics and momenta, for SWA's pass over the data.
struct BatchNormState {
  torch::Tensor mean, var, count;
  torch::nn::BatchNormOptions* options;
};

template <typename Norm>
bool add_norm(torch::nn::Module& child, std::vector<BatchNormState>& out) {
  auto* norm = dynamic_cast<Norm*>(&child);
  if (norm == nullptr || !norm->options.track_running_stats()) return norm != nullptr;
  out.push_back({norm->running_mean, norm->running_var, norm->num_batches_tracked, &norm->options});
  return true;
}

std::vector<BatchNormState> batch_norms(torch::nn::Module& module) {
  std::vector<BatchNormState> norms;
  for (const auto& child : module.modules(/*include_self=*/true)) {
    add_norm<torch::nn::BatchNorm1dImpl>(*child, norms) || add_norm<torch::nn::BatchNorm2dImpl>(*child, norms) ||
        add_norm<torch::nn::BatchNorm3dImpl>(*child, norms);
  }
  return norms;
}

}  // namespace

StochasticWeightAveraging::StochasticWeightAveraging(StochasticWeightAveragingOptions options)
    : WeightAveraging(WeightAveragingOptions().avg_fn(options.avg_fn()).use_buffers(false)), options_(std::move(options)) {
  const std::string me = "StochasticWeightAveraging(";
  bool positive = !options_.swa_lrs().empty();
  for (double lr : options_.swa_lrs()) positive = positive && lr > 0;
  LOCKSTEP_CHECK(positive, UsageError, me, "swa_lrs) needs learning rates above 0, one for every parameter group or ",
                 "one per group, e.g. StochasticWeightAveragingOptions(0.01).");
  const double start = options_.swa_epoch_start();
  LOCKSTEP_CHECK(start > 0 && (start < 1 || start == std::floor(start)), UsageError, me, "swa_epoch_start=", start,
                 ") is invalid: use a fraction of --max-epochs in (0, 1), or the epoch to start at counted from 1 ",
                 "(an integer, 1 or more).");
  LOCKSTEP_CHECK(options_.annealing_epochs() >= 0, UsageError, me, "annealing_epochs=", options_.annealing_epochs(),
                 ") is invalid: use 0 or more epochs.");
  const auto& how = options_.annealing_strategy();
  LOCKSTEP_CHECK(how == "cos" || how == "linear", UsageError, me, "annealing_strategy='", how,
                 "') is invalid: use \"cos\" or \"linear\".");
}

void StochasticWeightAveraging::on_fit_start(TrainerView& trainer, TrainingModule& module) {
  const std::string me = "StochasticWeightAveraging: ";
  const double start = options_.swa_epoch_start();
  LOCKSTEP_CHECK(start >= 1 || trainer.max_epochs() > 0, UsageError, me, "swa_epoch_start=", start, " is a fraction ",
                 "of --max-epochs, which is not set. Set --max-epochs, or give the epoch to start at (1 or more).");
  const int64_t first = start >= 1 ? static_cast<int64_t>(start) : static_cast<int64_t>(trainer.max_epochs() * start);
  swa_start_ = std::max<int64_t>(first - 1, 0);
  const auto& optimizers = trainer.optimizers();
  LOCKSTEP_CHECK(optimizers.size() == 1, UsageError, me, "SWA schedules one optimizer's learning rate, and ",
                 "configure_optimizers returned ", optimizers.size(), ". Return one optimizer.");
  const size_t groups = optimizers.front()->param_groups().size();
  const size_t given = options_.swa_lrs().size();
  LOCKSTEP_CHECK(given == 1 || given == groups, UsageError, me, given, " swa_lrs for an optimizer with ", groups,
                 " parameter groups: give one learning rate, or one per group.");
  WeightAveraging::on_fit_start(trainer, module);
}

bool StochasticWeightAveraging::should_update(std::optional<int64_t> step_idx, std::optional<int64_t> epoch_idx) const {
  return epoch_idx && *epoch_idx >= swa_start_;
}

double StochasticWeightAveraging::swa_lr_at(int64_t epoch, size_t group) const {
  const auto& lrs = options_.swa_lrs();
  const double swa_lr = lrs.size() == 1 ? lrs.front() : lrs.at(group);
  const int64_t anneal = options_.annealing_epochs();
  const double t = anneal == 0 ? 1.0
                               : std::min(1.0, static_cast<double>(epoch - swa_start_) / static_cast<double>(anneal));
  const double a = options_.annealing_strategy() == "cos" ? (1.0 - std::cos(M_PI * t)) / 2.0 : t;
  return swa_lr * a + lr0_.at(group) * (1.0 - a);
}

void StochasticWeightAveraging::set_learning_rates(TrainerView& trainer) {
  if (trainer.current_epoch() < swa_start_) return;
  auto& groups = trainer.optimizers().front()->param_groups();
  if (lr0_.empty()) {
    for (auto& group : groups) lr0_.push_back(group.options().get_lr());
  }
  for (size_t g = 0; g < groups.size(); ++g) groups[g].options().set_lr(swa_lr_at(trainer.current_epoch(), g));
}

void StochasticWeightAveraging::on_train_epoch_start(TrainerView& trainer, TrainingModule& module) {
  set_learning_rates(trainer);
}

void StochasticWeightAveraging::on_before_optimizer_step(TrainerView& trainer, TrainingModule& module) {
  set_learning_rates(trainer);
}

void StochasticWeightAveraging::on_fit_end(TrainerView& trainer, TrainingModule& module) {
  WeightAveraging::on_fit_end(trainer, module);
  auto norms = batch_norms(module);
  if (n_averaged() == 0 || norms.empty()) return;
  // As torch's update_bn: fresh statistics, a cumulative average over one pass, for the average's
  // weights; then the ranks' means, so that every rank (each saw its part of the data) holds one.
  std::vector<c10::optional<double>> momenta;
  for (auto& norm : norms) {
    torch::NoGradGuard no_grad;
    norm.mean.zero_();
    norm.var.fill_(1);
    if (norm.count.defined()) norm.count.zero_();
    momenta.push_back(norm.options->momentum());
    norm.options->momentum(c10::nullopt);  // a cumulative average
  }
  trainer.forward_training_batches();
  for (size_t i = 0; i < norms.size(); ++i) {
    norms[i].options->momentum(momenta[i]);
    for (auto* stat : {&norms[i].mean, &norms[i].var}) {
      torch::NoGradGuard no_grad;
      stat->copy_(torch::stack(trainer.all_gather(stat->detach().clone())).mean(0));
    }
  }
}

void StochasticWeightAveraging::save_extra(c10::impl::GenericDict& state) const {
  c10::List<double> lr0;
  for (double lr : lr0_) lr0.push_back(lr);
  state.insert("swa_lr0", lr0);
}

void StochasticWeightAveraging::load_extra(const c10::impl::GenericDict& state) {
  lr0_.clear();
  if (!state.contains("swa_lr0")) return;
  for (const auto& lr : state.at("swa_lr0").toListRef()) lr0_.push_back(lr.toDouble());
}

}  // namespace lockstep
