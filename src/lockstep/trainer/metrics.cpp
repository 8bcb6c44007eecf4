#include <lockstep/trainer/metrics.h>

#include <torch/torch.h>

#include <lockstep/strategies/strategy.h>

namespace lockstep {

void MetricCollection::begin_epoch(Phase phase) {
  phase_ = phase;
  epoch_[phase].clear();
  if (phase == Phase::train) train_steps_.clear();
}

// A weight of 0 leaves the sums as they are (a value times 0 would still turn them NaN).
void MetricCollection::add(EpochSum& sum, double value, int64_t weight) {
  if (weight == 0) return;
  sum.weighted_sum += value * static_cast<double>(weight);
  sum.weight += static_cast<double>(weight);
}

void MetricCollection::log(const std::string& name, double value, const LogOptions& options,
                           const std::function<double(double)>& sync_step) {
  const bool training = phase_ == Phase::train;
  const bool on_step = options.on_step().value_or(training);
  const bool on_epoch = options.on_epoch().value_or(!training);
  const bool both = on_step && on_epoch;
  if (on_step) {
    const std::string logged = both ? name + "_step" : name;
    const double v = options.sync_dist() ? sync_step(value) : value;
    pending_step_[logged] = v;
    latest_step_[logged] = v;
    prog_bar_[logged] = options.prog_bar();
    logger_[logged] = options.logger();
    if (training && !on_epoch) add(train_steps_[logged], v, batch_size_);
  }
  if (on_epoch) {
    // Created even at weight 0: every rank must pack the same names in end_epoch.
    auto& sum = epoch_[phase_][name];
    add(sum, value, batch_size_);
    sum.sync = sum.sync || options.sync_dist();
    sum.logged_name = both ? name + "_epoch" : name;
    prog_bar_[sum.logged_name] = options.prog_bar();
    logger_[sum.logged_name] = options.logger();
  }
}

std::map<std::string, double> MetricCollection::take_step_values() {
  std::map<std::string, double> values;
  values.swap(pending_step_);
  return values;
}

std::map<std::string, double> MetricCollection::end_epoch(strategies::Strategy& strategy) {
  // Every rank logs the same names in the same order (map order), so one all_reduce of the
  // sums and weights of all sync_dist metrics gives the global weighted means.
  auto& sums = epoch_[phase_];
  std::vector<double> packed;
  for (const auto& [name, sum] : sums) {
    if (!sum.sync) continue;
    packed.push_back(sum.weighted_sum);
    packed.push_back(sum.weight);
  }
  if (!packed.empty() && strategy.world_size() > 1) {
    auto t = strategy.all_reduce(torch::tensor(packed, torch::kFloat64), distributed::ReduceOp::sum);
    std::copy(t.data_ptr<double>(), t.data_ptr<double>() + t.numel(), packed.begin());
  }
  std::map<std::string, double> values;
  size_t next = 0;
  for (const auto& [name, sum] : sums) {
    double total = sum.weighted_sum, weight = sum.weight;
    if (sum.sync) {
      total = packed[next++];
      weight = packed[next++];
    }
    values[sum.logged_name] = weight > 0 ? total / weight : 0.0;
  }
  sums.clear();
  if (phase_ == Phase::train) {
    train_epoch_means_.clear();
    for (const auto& [name, sum] : train_steps_) {
      if (sum.weight > 0) train_epoch_means_[name] = sum.weighted_sum / sum.weight;
    }
  }
  return values;
}

bool MetricCollection::on_progress_bar(const std::string& logged_name) const {
  const auto it = prog_bar_.find(logged_name);
  return it != prog_bar_.end() && it->second;
}

bool MetricCollection::to_logger(const std::string& logged_name) const {
  const auto it = logger_.find(logged_name);
  return it == logger_.end() || it->second;
}

}  // namespace lockstep
