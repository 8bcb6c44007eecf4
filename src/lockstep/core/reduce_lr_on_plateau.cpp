#include <lockstep/core/reduce_lr_on_plateau.h>

#include <algorithm>
#include <limits>

#include <lockstep/core/error.h>

namespace lockstep {

ReduceLROnPlateau::ReduceLROnPlateau(torch::optim::Optimizer& optimizer, ReduceLROnPlateauOptions options)
    : LRScheduler(optimizer), optimizer_(optimizer), options_(std::move(options)) {
  const auto& o = options_;
  LOCKSTEP_CHECK(o.mode() == "min" || o.mode() == "max", UsageError, "ReduceLROnPlateau: mode '", o.mode(),
                 "' is unknown; use \"min\" (a loss) or \"max\" (an accuracy).");
  LOCKSTEP_CHECK(o.threshold_mode() == "rel" || o.threshold_mode() == "abs", UsageError, "ReduceLROnPlateau: ",
                 "threshold_mode '", o.threshold_mode(), "' is unknown; use \"rel\" or \"abs\".");
  LOCKSTEP_CHECK(o.factor() < 1.0, UsageError, "ReduceLROnPlateau: factor ", o.factor(), " would not lower the ",
                 "learning rate; use a factor below 1.0, e.g. 0.1.");
  LOCKSTEP_CHECK(o.patience() >= 0 && o.cooldown() >= 0, UsageError, "ReduceLROnPlateau: patience ", o.patience(),
                 " and cooldown ", o.cooldown(), " count steps; use 0 or more.");
  const size_t groups = optimizer_.param_groups().size();
  LOCKSTEP_CHECK(o.min_lrs().empty() || o.min_lrs().size() == groups, UsageError, "ReduceLROnPlateau: min_lrs has ",
                 o.min_lrs().size(), " value(s) and the optimizer ", groups, " parameter group(s); give one per ",
                 "group, or one min_lr for all.");
  best_ = o.mode() == "min" ? std::numeric_limits<double>::infinity() : -std::numeric_limits<double>::infinity();
}

bool ReduceLROnPlateau::is_better(double value) const {
  const double t = options_.threshold();
  const bool rel = options_.threshold_mode() == "rel";
  if (options_.mode() == "min") return value < (rel ? best_ * (1.0 - t) : best_ - t);
  return value > (rel ? best_ * (1.0 + t) : best_ + t);
}

void ReduceLROnPlateau::step(double metric) {
  ++last_epoch_;
  if (is_better(metric)) {
    best_ = metric;
    num_bad_epochs_ = 0;
  } else {
    ++num_bad_epochs_;
  }
  if (cooldown_counter_ > 0) {  // bad steps in the cooldown do not count
    --cooldown_counter_;
    num_bad_epochs_ = 0;
  }
  if (num_bad_epochs_ <= options_.patience()) return;
  auto& groups = optimizer_.param_groups();
  for (size_t i = 0; i < groups.size(); ++i) {
    const double old_lr = groups[i].options().get_lr();
    const double floor = options_.min_lrs().empty() ? options_.min_lr() : options_.min_lrs()[i];
    const double new_lr = std::max(old_lr * options_.factor(), floor);
    if (old_lr - new_lr > options_.eps()) groups[i].options().set_lr(new_lr);
  }
  cooldown_counter_ = options_.cooldown();
  num_bad_epochs_ = 0;
}

c10::impl::GenericDict ReduceLROnPlateau::state_dict() const {
  c10::impl::GenericDict state(c10::StringType::get(), c10::AnyType::get());
  state.insert("best", best_);
  state.insert("num_bad_epochs", num_bad_epochs_);
  state.insert("cooldown_counter", cooldown_counter_);
  state.insert("last_epoch", last_epoch_);
  return state;
}

void ReduceLROnPlateau::load_state_dict(const c10::impl::GenericDict& state) {
  best_ = state.at("best").toDouble();
  num_bad_epochs_ = state.at("num_bad_epochs").toInt();
  cooldown_counter_ = state.at("cooldown_counter").toInt();
  last_epoch_ = state.at("last_epoch").toInt();
}

}  // namespace lockstep
