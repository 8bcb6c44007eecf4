#include <lockstep/callbacks/weight_averaging.h>

#include <set>

#include <torch/torch.h>

#include <lockstep/core/error.h>
#include <lockstep/core/training_module.h>

namespace lockstep {
namespace {

std::map<std::string, torch::Tensor> cloned(const std::vector<std::pair<std::string, torch::Tensor>>& weights,
                                            const std::map<std::string, torch::Tensor>& only) {
  std::map<std::string, torch::Tensor> copy;
  for (const auto& [name, tensor] : weights) {
    if (only.count(name)) copy.emplace(name, tensor.clone());
  }
  return copy;
}

int64_t int_of(const c10::impl::GenericDict& state, const char* key, int64_t otherwise) {
  return state.contains(key) ? state.at(key).toInt() : otherwise;
}

}  // namespace

AveragingFunction get_ema_avg_fn(double decay) {
  return [decay](torch::Tensor& average, const torch::Tensor& current, int64_t) { average.lerp_(current, 1.0 - decay); };
}

AveragingFunction get_swa_avg_fn() {
  return [](torch::Tensor& average, const torch::Tensor& current, int64_t num_averaged) {
    average.add_((current - average) / static_cast<double>(num_averaged + 1));
  };
}

WeightAveraging::WeightAveraging(WeightAveragingOptions options) : options_(std::move(options)) {
  if (!options_.avg_fn()) options_.avg_fn(get_swa_avg_fn());
}

bool WeightAveraging::should_update(std::optional<int64_t> step_idx, std::optional<int64_t> epoch_idx) const {
  return step_idx.has_value();
}

void WeightAveraging::on_fit_start(TrainerView& trainer, TrainingModule& module) {
  trainer_ = &trainer;
  if (!loaded_) return;
  // A resumed run: the checkpoint's average, laid out as this run's strategy holds the weights.
  if (loaded_->contains("state_dict")) average_ = trainer.local_weights_of(loaded_->at("state_dict").toGenericDict());
  loaded_.reset();
}

void WeightAveraging::on_fit_end(TrainerView& trainer, TrainingModule& module) {
  swap_back(trainer);
  if (n_averaged_ > 0) trainer.load_local_weights(average_);
}

void WeightAveraging::on_train_batch_end(TrainerView& trainer, TrainingModule& module, const torch::Tensor& loss,
                                         int64_t batch_idx) {
  // Once per optimizer step (not on accumulating batches), as Lightning's.
  const int64_t step = trainer.global_step();
  if (step <= latest_update_step_ || !should_update(step - 1, std::nullopt)) return;
  update(trainer, module);
  latest_update_step_ = step;
}

void WeightAveraging::on_train_epoch_end(TrainerView& trainer, TrainingModule& module) {
  const int64_t epoch = trainer.current_epoch();
  if (epoch <= latest_update_epoch_ || !should_update(std::nullopt, epoch)) return;
  update(trainer, module);
  latest_update_epoch_ = epoch;
}

void WeightAveraging::update(TrainerView& trainer, TrainingModule& module) {
  torch::NoGradGuard no_grad;
  std::set<std::string> buffers;
  for (const auto& item : module.named_buffers()) buffers.insert(item.key());
  const auto& average = options_.avg_fn();
  for (const auto& [name, current] : trainer.local_weights()) {
    if (!options_.use_buffers() && buffers.count(name)) continue;
    const auto found = average_.find(name);
    if (n_averaged_ == 0 || found == average_.end()) {
      average_[name] = current.clone();
    } else if (!current.is_floating_point()) {
      found->second.copy_(current);  // a count (num_batches_tracked) follows the model
    } else {
      average(found->second, current, n_averaged_);
    }
  }
  ++n_averaged_;
}

void WeightAveraging::on_validation_start(TrainerView& trainer, TrainingModule& module) {
  if (trainer_ == nullptr || trainer.sanity_checking() || n_averaged_ == 0 || !swaps_for_validation()) return;
  training_ = cloned(trainer.local_weights(), average_);
  trainer.load_local_weights(average_);
}

void WeightAveraging::on_validation_end(TrainerView& trainer, TrainingModule& module) { swap_back(trainer); }

void WeightAveraging::on_exception(TrainerView& trainer, TrainingModule& module, const std::exception& error) {
  swap_back(trainer);
}

void WeightAveraging::swap_back(TrainerView& trainer) {
  if (training_.empty()) return;
  trainer.load_local_weights(training_);
  training_.clear();
}

c10::IValue WeightAveraging::state_dict() const {
  if (loaded_) return *loaded_;  // restored, and fit has not started to take it
  c10::impl::GenericDict state(c10::StringType::get(), c10::AnyType::get());
  state.insert("n_averaged", n_averaged_);
  state.insert("latest_update_step", latest_update_step_);
  state.insert("latest_update_epoch", latest_update_epoch_);
  save_extra(state);
  if (n_averaged_ > 0 && trainer_ != nullptr) {
    c10::impl::GenericDict weights(c10::StringType::get(), c10::TensorType::get());
    for (const auto& item : trainer_->checkpoint_weights(average_)) weights.insert(item.key(), item.value());
    state.insert("state_dict", weights);
  }
  return state;
}

void WeightAveraging::load_state_dict(const c10::IValue& state) {
  LOCKSTEP_CHECK(state.isGenericDict(), UsageError, name(), ": the checkpoint's state of this callback is not a ",
                 "dict; resume from a checkpoint that a run with ", name(), " saved.");
  const auto dict = state.toGenericDict();
  n_averaged_ = int_of(dict, "n_averaged", 0);
  latest_update_step_ = int_of(dict, "latest_update_step", 0);
  latest_update_epoch_ = int_of(dict, "latest_update_epoch", -1);
  load_extra(dict);
  average_.clear();
  loaded_ = dict;
}

EMAWeightAveraging::EMAWeightAveraging(EMAWeightAveragingOptions options)
    : WeightAveraging(WeightAveragingOptions().avg_fn(get_ema_avg_fn(options.decay())).use_buffers(options.use_buffers())),
      options_(std::move(options)) {
  LOCKSTEP_CHECK(options_.decay() >= 0 && options_.decay() <= 1, UsageError, "EMAWeightAveraging(decay=",
                 options_.decay(), ") is invalid: use a weight of the old average in [0, 1], e.g. 0.999.");
  LOCKSTEP_CHECK(options_.update_every_n_steps() >= 0, UsageError, "EMAWeightAveraging(update_every_n_steps=",
                 options_.update_every_n_steps(), ") is invalid: use 1 or more (0: only at epoch ends).");
}

bool EMAWeightAveraging::should_update(std::optional<int64_t> step_idx, std::optional<int64_t> epoch_idx) const {
  if (step_idx) {
    const auto start = options_.update_starting_at_step();
    const int64_t every = options_.update_every_n_steps();
    if ((!start || *step_idx >= *start) && every > 0 && *step_idx % every == 0) return true;
  }
  const auto from_epoch = options_.update_starting_at_epoch();
  return epoch_idx && from_epoch && *epoch_idx >= *from_epoch;
}

}  // namespace lockstep
