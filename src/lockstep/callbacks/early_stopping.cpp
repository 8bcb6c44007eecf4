#include <lockstep/callbacks/early_stopping.h>

#include <cmath>
#include <iostream>
#include <limits>

#include <lockstep/callbacks/metric_format.h>
#include <lockstep/core/error.h>

namespace lockstep {
namespace {

using detail::python_float;

std::string fixed3(double value) { return detail::format_number("%.3f", value); }

}  // namespace

EarlyStopping::EarlyStopping(EarlyStoppingOptions options) : options_(std::move(options)) {
  if (options_.mode() != "min" && options_.mode() != "max") {
    throw UsageError("EarlyStopping(mode='" + options_.mode() +
                     "') is invalid: use \"min\" (stop when it stops decreasing, e.g. a loss) or \"max\".");
  }
  if (options_.patience() < 0) {
    throw UsageError("EarlyStopping(patience=" + std::to_string(options_.patience()) +
                     ") is invalid: use the number of checks without improvement to wait (0 or more).");
  }
  const double inf = std::numeric_limits<double>::infinity();
  best_score_ = options_.mode() == "min" ? inf : -inf;
}

std::string EarlyStopping::name() const {
  return "EarlyStopping{'monitor': '" + options_.monitor() + "', 'mode': '" + options_.mode() + "'}";
}

void EarlyStopping::on_fit_start(TrainerView& trainer, TrainingModule& module) {
  fitting_ = true;
  // As Lightning: check at epoch ends only when validation runs exactly there. When it skips
  // epochs, an epoch-end check would count the stale value again; when it runs within the epoch
  // (val_check_interval), each validation is checked as it ends.
  const bool validates_at_epoch_ends_only = trainer.check_val_every_n_epoch() == 1 &&
                                            trainer.val_check_batch() >= trainer.num_training_batches();
  on_train_epoch_end_ = options_.check_on_train_epoch_end().value_or(validates_at_epoch_ends_only);
}

void EarlyStopping::on_fit_end(TrainerView& trainer, TrainingModule& module) { fitting_ = false; }

void EarlyStopping::on_validation_end(TrainerView& trainer, TrainingModule& module) {
  if (fitting_ && !on_train_epoch_end_ && !trainer.sanity_checking()) check(trainer);
}

void EarlyStopping::on_train_epoch_end(TrainerView& trainer, TrainingModule& module) {
  if (fitting_ && on_train_epoch_end_) check(trainer);
}

bool EarlyStopping::better(double a, double b) const { return options_.mode() == "min" ? a < b : a > b; }

void EarlyStopping::check(TrainerView& trainer) {
  if (trainer.fast_dev_run() > 0) return;  // as Lightning's: a fast_dev_run stops by itself
  const auto& metrics = trainer.callback_metrics();
  const auto found = metrics.find(options_.monitor());
  bool stop = false;
  if (found != metrics.end()) {
    stop = evaluate(found->second);
  } else {
    std::string available;
    for (const auto& [name, value] : metrics) available += (available.empty() ? "`" : ", `") + name + "`";
    const std::string message = "Early stopping conditioned on metric `" + options_.monitor() +
                                "` which is not available. Pass in or modify your `EarlyStopping` callback to use "
                                "any of the following: " +
                                (available.empty() ? "(nothing was logged)" : available);
    if (options_.strict()) throw UsageError(message);
    if (options_.verbose() && trainer.is_global_zero()) std::cerr << "Warning: " << message << "\n";
  }
  // A rank whose own value says stop stops every rank: they must leave fit together.
  const bool mine = stop;
  stop = trainer.any_rank(stop);
  if (stop) {
    stopped_epoch_ = trainer.current_epoch();
    trainer.request_stop();
    if (trainer.is_global_zero()) std::cerr << stop_line(mine) << "\n";
    return;
  }
  if (options_.verbose() && found != metrics.end() && trainer.is_global_zero()) {
    const int world = trainer.world_size();
    std::cerr << (world > 1 ? "[rank: 0] " : "") << reason_ << "\n";
  }
}

std::string EarlyStopping::stop_line(bool mine) const {
  const std::string& monitor = options_.monitor();
  std::string why = mine ? reason_ : "Another rank's " + monitor + " asked to stop.";
  const std::string signaling = " Signaling Trainer to stop.";
  if (why.size() > signaling.size() && why.compare(why.size() - signaling.size(), signaling.size(), signaling) == 0) {
    why.erase(why.size() - signaling.size());
  }
  return "lockstep: EarlyStopping stopped training at epoch " + std::to_string(stopped_epoch_) + " (monitor " +
         monitor + ", mode " + options_.mode() + ", best " + fixed3(best_score_) + ", patience " +
         std::to_string(options_.patience()) + "): " + why;
}

bool EarlyStopping::evaluate(double current) {
  const std::string& monitor = options_.monitor();
  const bool min = options_.mode() == "min";
  const std::string order = min ? "<" : ">";
  if (options_.check_finite() && !std::isfinite(current)) {
    reason_ = "Monitored metric " + monitor + " = " + python_float(current) + " is not finite. Previous best value was " +
              fixed3(best_score_) + ". Signaling Trainer to stop.";
    return true;
  }
  if (options_.stopping_threshold() && better(current, *options_.stopping_threshold())) {
    reason_ = "Stopping threshold reached: " + monitor + " = " + python_float(current) + " " + order + " " +
              python_float(*options_.stopping_threshold()) + ". Signaling Trainer to stop.";
    return true;
  }
  if (options_.divergence_threshold() && better(-current, -*options_.divergence_threshold())) {
    reason_ = "Divergence threshold reached: " + monitor + " = " + python_float(current) + " " + (min ? ">" : "<") + " " +
              python_float(*options_.divergence_threshold()) + ". Signaling Trainer to stop.";
    return true;
  }
  const double delta = min ? -options_.min_delta() : options_.min_delta();
  if (better(current - delta, best_score_)) {
    reason_ = std::isfinite(best_score_)
                  ? "Metric " + monitor + " improved by " + fixed3(std::abs(best_score_ - current)) +
                        " >= min_delta = " + python_float(std::abs(options_.min_delta())) + ". New best score: " +
                        fixed3(current)
                  : "Metric " + monitor + " improved. New best score: " + fixed3(current);
    best_score_ = current;
    wait_count_ = 0;
    return false;
  }
  ++wait_count_;
  if (wait_count_ < options_.patience()) {
    reason_ = "Metric " + monitor + " did not improve (" + std::to_string(wait_count_) + " of " +
              std::to_string(options_.patience()) + " checks). Best score: " + fixed3(best_score_);
    return false;
  }
  reason_ = "Monitored metric " + monitor + " did not improve in the last " + std::to_string(wait_count_) +
            " records. Best score: " + fixed3(best_score_) + ". Signaling Trainer to stop.";
  return true;
}

c10::IValue EarlyStopping::state_dict() const {
  c10::impl::GenericDict state(c10::StringType::get(), c10::AnyType::get());
  state.insert("wait_count", wait_count_);
  state.insert("stopped_epoch", stopped_epoch_);
  state.insert("best_score", best_score_);
  state.insert("patience", options_.patience());
  return state;
}

void EarlyStopping::load_state_dict(const c10::IValue& state) {
  if (!state.isGenericDict()) return;
  const auto dict = state.toGenericDict();
  // patience stays as this run's options say, so a resumed run may be given more or less of it.
  if (dict.contains("wait_count")) wait_count_ = dict.at("wait_count").toInt();
  if (dict.contains("stopped_epoch")) stopped_epoch_ = dict.at("stopped_epoch").toInt();
  if (dict.contains("best_score")) {
    const auto best = dict.at("best_score");
    best_score_ = best.isTensor() ? best.toTensor().item<double>() : best.toScalar().toDouble();
  }
}

}  // namespace lockstep
