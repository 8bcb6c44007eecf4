#include <lockstep/trainer/trainer_options.h>

#include <limits>

#include <lockstep/plan/trainer_variables.h>

namespace lockstep {

// The ranges are those the flags check (cli/trainer_flags.cpp).
void apply_trainer_variables(TrainerOptions& o, const environments::Environ& environ) {
  if (!o.trainer_variables()) return;
  const TrainerOptions d;
  const TrainerVariables v(environ);
  constexpr int64_t many = int64_t{1} << 40;
  v.set("max_epochs", o.max_epochs(), d.max_epochs(), -1, many);
  v.set("max_steps", o.max_steps(), d.max_steps(), -1, int64_t{1} << 50);
  v.set("accumulate_grad_batches", o.accumulate_grad_batches(), d.accumulate_grad_batches(), 1, many);
  v.set("gradient_clip_val", o.gradient_clip_val(), d.gradient_clip_val(), 0.0, 1e12);
  v.set("gradient_clip_algorithm", o.gradient_clip_algorithm(), d.gradient_clip_algorithm(), {"norm", "value"});
  v.set("seed", o.seed(), d.seed(), -1, std::numeric_limits<int64_t>::max());
  v.set("deterministic", o.deterministic(), d.deterministic());
  v.set("default_root_dir", o.default_root_dir(), d.default_root_dir());
  v.set("ckpt_path", o.ckpt_path(), d.ckpt_path());
  v.set("ckpt_path_rename", o.ckpt_path_rename(), d.ckpt_path_rename());
  v.set("init_weights", o.init_weights(), d.init_weights());
  v.set("init_weights_rename", o.init_weights_rename(), d.init_weights_rename());
  v.set("init_weights_strict", o.init_weights_strict(), d.init_weights_strict());
  v.set("limit_train_batches", o.limit_train_batches(), d.limit_train_batches());
  v.set("limit_val_batches", o.limit_val_batches(), d.limit_val_batches());
  v.set("limit_test_batches", o.limit_test_batches(), d.limit_test_batches());
  v.set("overfit_batches", o.overfit_batches(), d.overfit_batches());
  v.set("val_check_interval", o.val_check_interval(), d.val_check_interval());
  v.set("check_val_every_n_epoch", o.check_val_every_n_epoch(), d.check_val_every_n_epoch(), 1, many);
  v.set("num_sanity_val_steps", o.num_sanity_val_steps(), d.num_sanity_val_steps(), -1, many);
  v.set("log_every_n_steps", o.log_every_n_steps(), d.log_every_n_steps(), 1, many);
  v.set("enable_progress_bar", o.enable_progress_bar(), d.enable_progress_bar());
  v.set("enable_checkpointing", o.enable_checkpointing(), d.enable_checkpointing());
  v.set("fast_dev_run", o.fast_dev_run(), d.fast_dev_run(), 0, many);
  v.set("enable_model_summary", o.enable_model_summary(), d.enable_model_summary());
  v.set("inference_mode", o.inference_mode(), d.inference_mode());
  v.set("use_distributed_sampler", o.use_distributed_sampler(), d.use_distributed_sampler());
  v.set("detect_anomaly", o.detect_anomaly(), d.detect_anomaly());
  v.set("benchmark", o.benchmark(), d.benchmark());
  v.set("profiler", o.profiler(), d.profiler(), {"simple", "pytorch", "true", "false"});
  v.set("lr_find", o.lr_find(), d.lr_find());
  v.set("scale_batch_size", o.scale_batch_size(), d.scale_batch_size(), {"", "power", "binsearch"});
  apply_trainer_variables(static_cast<PlanOptions&>(o), environ);  // the plan's fields, and the mark
}

}  // namespace lockstep
