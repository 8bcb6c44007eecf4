// The Trainer's loops: one training epoch, an evaluation pass (validation, test), a step under
// the run's precision, the optimizer step, and the metrics each emits.
#include <algorithm>
#include <chrono>
#include <optional>

#include <torch/torch.h>

#include <lockstep/distributed/rank_zero.h>
#include <lockstep/loggers/logger.h>
#include <lockstep/trainer/trainer.h>

#include "elastic_run.h"
#include "trainer_internal.h"

namespace lockstep {
namespace detail {

EvaluationBatch evaluation_batch(DataLoader& loader, int64_t i) {
  EvaluationBatch result{loader.batch(i), 0};
  const int64_t size = result.batch.size();
  result.counted = size - loader.padding_in_batch(i);
  if (result.counted == 0 || result.counted == size) return result;
  auto& target = result.batch.target;
  result.batch.data = result.batch.data.narrow(0, 0, result.counted);
  if (target.defined() && target.dim() > 0 && target.size(0) == size) target = target.narrow(0, 0, result.counted);
  return result;
}

}  // namespace detail

torch::Tensor Trainer::run_step(const std::function<torch::Tensor()>& step) {
  Precision::StepScope scope(plan_.precision);
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
  log_metrics(row, global_step_);
}

void Trainer::emit_step_metrics(bool force, std::optional<int64_t> epoch) {
  if (!force && global_step_ % options_.log_every_n_steps() != 0) return;
  auto values = metrics_.take_step_values();
  for (const auto& [name, value] : values) callback_metrics_[name] = value;
  emit(values, epoch);
}

void Trainer::optimizer_step() {
  // 16-mixed: gradients back to their true size before clipping; a step with an inf or a NaN is
  // skipped (the ranks agree: DDP averaged the gradients) and still counts as a step, as in Lightning.
  const bool skip = scaler_ && !scaler_->unscale(module_->parameters());
  if (options_.gradient_clip_val() > 0 && !skip) {
    auto params = module_->parameters();
    if (options_.gradient_clip_algorithm() == "value") {
      torch::nn::utils::clip_grad_value_(params, options_.gradient_clip_val());
    } else {
      plan_.strategy->clip_grad_norm(params, options_.gradient_clip_val(), 2.0);
    }
  }
  each_callback("on_before_optimizer_step", [&](Callback& c) { c.on_before_optimizer_step(*this, *module_); });
  auto timed = profile("optimizer_step");
  for (auto& optimizer : optimizer_config_.optimizers) {
    if (!skip) optimizer->step();
    optimizer->zero_grad();
  }
  if (scaler_) scaler_->update(skip);
  ++global_step_;
  // Here rather than after the batch's hooks (Lightning's place for a ReduceLROnPlateau): a
  // checkpoint written by those hooks then holds the stepped state and resumes exactly.
  step_schedulers("step");
}

std::map<std::string, double> Trainer::run_evaluation(DataLoader& loader, Phase phase, int64_t max_batches) {
  auto timed = profile(phase == Phase::test ? "test" : "validation");
  EvaluationGuard evaluating(options_.inference_mode());
  module_->eval();
  const Phase outer_phase = metrics_.phase();  // train, when validating within a training epoch
  metrics_.begin_epoch(phase);
  if (phase == Phase::validation) {
    module_->on_validation_epoch_start();
    each_callback("on_validation_start", [&](Callback& c) { c.on_validation_start(*this, *module_); });
  }
  const auto device = plan_.strategy->root_device();
  for (int64_t i = 0; i < max_batches; ++i) {
    detail::EvaluationBatch next = [&] {
      auto fetch = profile(phase == Phase::test ? "test_dataloader_next" : "val_dataloader_next");
      return detail::evaluation_batch(loader, i);
    }();
    Batch& batch = next.batch;
    module_->transfer_batch_to_device(batch, device);
    plan_.precision.convert_batch(batch);
    metrics_.set_batch_size(next.counted);
    auto step = profile(phase == Phase::test ? "test_step" : "validation_step");
    run_step([&] {
      plan_.strategy->before_evaluation_step();
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
  start_training_epoch(train);
  const int64_t accumulate = options_.accumulate_grad_batches();
  const bool automatic = module_->automatic_optimization();
  const bool validate_this_epoch = val != nullptr && (current_epoch_ + 1) % options_.check_val_every_n_epoch() == 0;
  // A mid-epoch checkpoint resumes at its next batch: the sampler's order depends only on the epoch.
  int64_t batches_run = std::min(resume_batch_, num_training_batches_);
  resume_batch_ = 0;
  batches_done_ = step_boundary_batch_ = batches_run;
  int64_t validated_after = -1;  // batches run when validation last ran in this epoch
  for (int64_t i = batches_run; i < num_training_batches_; ++i) {
    if (options_.max_steps() >= 0 && global_step_ >= options_.max_steps()) break;
    const bool step_now = (i + 1) % accumulate == 0 || i + 1 == num_training_batches_;
    run_training_batch(train, i, step_now, automatic);
    batches_run = i + 1;
    // Within the epoch only; validation after the last batch runs below, after the epoch metrics.
    if (validate_this_epoch && batches_run % val_check_batch_ == 0 && batches_run < num_training_batches_) {
      run_validation(*val);
      validated_after = batches_run;
      // EarlyStopping may ask to stop here; every rank must leave the epoch at the same batch.
      should_stop_ = plan_.strategy->reduce_boolean_decision(should_stop_, distributed::Decision::any);
      if (should_stop_) break;
    }
    // After a whole optimizer step (and its validation): where every rank can stop together.
    if ((step_now || !automatic) && agreed_stop_ != nullptr) {
      stop_request_ = agreed_stop_->at_step(global_step_);
      if (stop_request_) break;
    }
  }
  plan_.strategy->set_gradient_sync(true);
  if (stop_request_) return;  // the epoch is not over: fit saves where it stands
  // A full epoch validates at its end when its last batch is a check batch (so "0.3" of 10
  // batches validates after 3, 6 and 9, as Lightning's); an epoch cut short by max_steps or a
  // stop validates once more unless it just did.
  const bool full_epoch = batches_run == num_training_batches_;
  const bool validate_at_end =
      validate_this_epoch && (full_epoch ? num_training_batches_ % val_check_batch_ == 0 : validated_after != batches_run);
  end_training_epoch(validate_at_end ? val : nullptr);
}

void Trainer::start_training_epoch(DataLoader& train) {
  train.set_epoch(current_epoch_);
  module_->train();
  metrics_.begin_epoch(Phase::train);
  // Before the hooks, so that callbacks (the progress bar) know the epoch's length.
  num_training_batches_ = options_.limit_train_batches().of(train.num_batches());
  module_->on_train_epoch_start();
  each_callback("on_train_epoch_start", [&](Callback& c) { c.on_train_epoch_start(*this, *module_); });
}

torch::Tensor Trainer::run_training_batch(DataLoader& train, int64_t i, bool step_now, bool automatic) {
  Batch batch = [&] {
    auto fetch = profile("train_dataloader_next");
    return train.batch(i);
  }();
  const auto device = plan_.strategy->root_device();
  auto transfer = profile("transfer_batch_to_device");
  module_->transfer_batch_to_device(batch, device);
  transfer.stop();
  plan_.precision.convert_batch(batch);
  metrics_.set_batch_size(batch.size());
  if (automatic) plan_.strategy->set_gradient_sync(step_now);
  torch::Tensor loss = run_step([&] {
    auto timed = profile("training_step");
    return plan_.strategy->training_step(*module_, batch, i);
  });
  check_loss(loss, i);
  if (automatic && loss.defined()) {
    const int64_t accumulate = options_.accumulate_grad_batches();
    auto backward = profile("backward");
    auto to_backward = accumulate > 1 ? loss / static_cast<double>(accumulate) : loss;
    plan_.strategy->backward(scaler_ ? scaler_->scale(to_backward) : to_backward);
    backward.stop();
    if (step_now) optimizer_step();
  } else if (!automatic) {
    ++global_step_;
  }
  batches_done_ = i + 1;  // a checkpoint from here on resumes at the next batch
  if (step_now || !automatic) step_boundary_batch_ = batches_done_;
  // Before the hooks: a checkpoint they write waits for every rank, and a lost one never answers.
  if (attempt_record_) attempt_record_->at_step(global_step_);
  module_->on_train_batch_end(loss, batch, i);
  each_callback("on_train_batch_end", [&](Callback& c) { c.on_train_batch_end(*this, *module_, loss, i); });
  emit_step_metrics(false);
  return loss;
}

void Trainer::end_training_epoch(DataLoader* val) {
  module_->on_train_epoch_end();
  auto values = metrics_.end_epoch(*plan_.strategy);
  for (const auto& [name, value] : values) callback_metrics_[name] = value;
  emit(values);
  if (val != nullptr) run_validation(*val);
  step_schedulers("epoch");  // after validation: a ReduceLROnPlateau may watch val_loss
  epoch_completed_ = true;  // checkpoints written from here on resume at the next epoch
  each_callback("on_train_epoch_end", [&](Callback& c) { c.on_train_epoch_end(*this, *module_); });
  // A stop requested on one rank (EarlyStopping agrees first, but a user hook may not) must stop all.
  should_stop_ = plan_.strategy->reduce_boolean_decision(should_stop_, distributed::Decision::any);
}

void Trainer::forward_training_batches() {
  LOCKSTEP_CHECK(fit_train_ != nullptr, UsageError, "Trainer::forward_training_batches runs over fit's training ",
                 "data: call it from a callback hook during fit (on_fit_end included).");
  torch::NoGradGuard no_grad;  // a sharded strategy then gathers as for evaluation
  module_->train();
  const auto device = plan_.strategy->root_device();
  for (int64_t i = 0; i < num_training_batches_; ++i) {
    Batch batch = fit_train_->batch(i);
    module_->transfer_batch_to_device(batch, device);
    plan_.precision.convert_batch(batch);
    metrics_.set_batch_size(batch.size());
    run_step([&] {
      plan_.strategy->before_evaluation_step();
      return module_->training_step(batch, i);
    });
  }
}

void Trainer::run_validation(DataLoader& val) {
  num_val_batches_ = options_.limit_val_batches().of(val.num_batches());
  run_evaluation(val, Phase::validation, num_val_batches_);
}

}  // namespace lockstep
