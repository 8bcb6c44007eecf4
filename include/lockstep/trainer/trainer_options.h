#pragma once
/// TrainerOptions: everything a Trainer run is configured by: the PlanOptions it shares with
/// Fabric (accelerator, devices, strategy, num_nodes, precision, ...; plan/plan_options.h) and the
/// loop's own. Every field (but trainer_variables) is also a command-line flag (`--max-epochs`)
/// and an environment variable (`LOCKSTEP_TRAINER_MAX_EPOCHS`), which also reaches options built
/// in code; see cli/trainer_flags.h for which wins.

#include <cstdint>
#include <string>

#include <torch/arg.h>

#include <lockstep/plan/batch_limit.h>
#include <lockstep/plan/plan_options.h>

namespace lockstep {
namespace environments {
class Environ;
}

///   Trainer trainer(TrainerOptions().devices("2").strategy("ddp").max_epochs(3));
struct TrainerOptions : PlanOptionsOf<TrainerOptions> {
  /// Stop after this many epochs; -1 means 1000 when max_steps is also unset (as Lightning). Default: -1.
  TORCH_ARG(int64_t, max_epochs) = -1;
  /// Stop after this many optimizer steps; -1 = no limit. Default: -1.
  TORCH_ARG(int64_t, max_steps) = -1;
  /// Accumulate gradients over this many batches per optimizer step. Default: 1.
  TORCH_ARG(int64_t, accumulate_grad_batches) = 1;
  /// Clip gradients to this norm (or value); 0 disables. Default: 0.
  TORCH_ARG(double, gradient_clip_val) = 0.0;
  /// norm|value. Default: "norm".
  TORCH_ARG(std::string, gradient_clip_algorithm) = "norm";
  /// Seed for every random generator, applied at fit() (the --seed flag applies it when parsed,
  /// before the model is built); -1 leaves them unseeded. Default: -1.
  TORCH_ARG(int64_t, seed) = -1;
  /// LibTorch's deterministic algorithms only (at::Context::setDeterministicAlgorithms, which
  /// also makes cuDNN pick deterministic convolutions): an operation without a deterministic
  /// kernel (put_ without accumulate, index_add_ on CUDA, ...) throws instead of running, and on
  /// CUDA CUBLAS_WORKSPACE_CONFIG=:4096:8 unless set, as Lightning's deterministic=True. Set at
  /// fit (validate, test, predict) and left set. Default: false.
  TORCH_ARG(bool, deterministic) = false;
  /// Where logs and checkpoints go. Default: "." (as Lightning's current directory).
  TORCH_ARG(std::string, default_root_dir) = ".";
  /// Checkpoint to resume from, or "last": the Trainer's own, or one that PyTorch Lightning 2.x
  /// wrote (checkpoint/lightning_checkpoint.h). Default: "" (start fresh).
  TORCH_ARG(std::string, ckpt_path) = "";
  /// KeyMap rules for the names of a Lightning checkpoint given to ckpt_path, "FROM=TO" separated
  /// by commas, where the one prefix rule found by matching the file's names to the module's does
  /// not do. Refused with the Trainer's own checkpoints, whose names are the module's.
  /// Default: "" (found).
  TORCH_ARG(std::string, ckpt_path_rename) = "";
  /// Weights to start from, loaded into the module before fit (validate, test, predict) sets it
  /// up, as `model.load_state_dict(torch.load(path))` before Lightning's fit: a file of Python's
  /// torch.save(model.state_dict(), path), a checkpoint whose "state_dict" is taken, or a
  /// ".safetensors" file (or a sharded model's ".safetensors.index.json"). Only the
  /// weights, unlike ckpt_path, which resumes a whole run (and restores over these). Default: "".
  TORCH_ARG(std::string, init_weights) = "";
  /// KeyMap rules for init_weights' names, "FROM=TO" separated by commas: "model.=" strips the
  /// prefix "model." (checkpoint/key_map.h). Default: "" (names as they are).
  TORCH_ARG(std::string, init_weights_rename) = "";
  /// Every name of the module and of init_weights must match; false leaves the module's
  /// missing names at their initial values and skips the file's extra ones (shapes must still
  /// match). Default: true.
  TORCH_ARG(bool, init_weights_strict) = true;
  /// Fraction (0.25) or count (10) of training batches per epoch. Default: 1.0.
  TORCH_ARG(BatchLimit, limit_train_batches) = 1.0;
  /// Fraction or count of validation batches. Default: 1.0.
  TORCH_ARG(BatchLimit, limit_val_batches) = 1.0;
  /// Fraction or count of test batches. Default: 1.0.
  TORCH_ARG(BatchLimit, limit_test_batches) = 1.0;
  /// Train and validate on this fraction (0.25) or count (10) of the batches only, in the same
  /// order every epoch (the shuffle of the training and validation loaders is turned off), to see
  /// that the model can overfit them (Lightning's overfit_batches; it replaces
  /// limit_train_batches and limit_val_batches). 0: off. Default: 0.0.
  TORCH_ARG(BatchLimit, overfit_batches) = 0.0;
  /// Validate within the training epoch: a fraction in (0, 1] of the epoch's batches (0.25:
  /// four times an epoch) or a count of training batches (100: after every 100th). Default: 1.0.
  TORCH_ARG(BatchLimit, val_check_interval) = 1.0;
  /// Validate every N training epochs. Default: 1.
  TORCH_ARG(int64_t, check_val_every_n_epoch) = 1;
  /// Validation batches run before training as a sanity check. Default: 2.
  TORCH_ARG(int64_t, num_sanity_val_steps) = 2;
  /// Write logged metrics every N optimizer steps. Default: 50.
  TORCH_ARG(int64_t, log_every_n_steps) = 50;
  /// Show the progress bar on rank 0. Default: true.
  TORCH_ARG(bool, enable_progress_bar) = true;
  /// Save a checkpoint at the end of every epoch (ModelCheckpoint). Default: true.
  TORCH_ARG(bool, enable_checkpointing) = true;
  /// Run n batches of training, validation and test once, to find bugs (Lightning's
  /// fast_dev_run): one epoch of n steps, no sanity check, and nothing written (no logger, no
  /// checkpoint; ModelCheckpoint and EarlyStopping stand aside). 0: off. Default: 0.
  TORCH_ARG(int64_t, fast_dev_run) = 0;
  /// Print, on rank 0 when fit starts, a table of the module's parts, their parameter counts and
  /// modes, and the totals (Lightning's ModelSummary, max_depth 1; model_summary()). Default: true.
  TORCH_ARG(bool, enable_model_summary) = true;
  /// Validation, test and predict run under LibTorch's InferenceMode (c10::InferenceMode, as
  /// Lightning's inference_mode=True); false: under NoGradGuard (torch.no_grad), for a step whose
  /// tensors must later take part in autograd. Default: true.
  TORCH_ARG(bool, inference_mode) = true;
  /// Put a DistributedSampler on the loaders under DDP. Default: true.
  TORCH_ARG(bool, use_distributed_sampler) = true;
  /// Autograd's anomaly mode during fit: a backward that makes a NaN names the operation whose
  /// forward made it (slow; for debugging, as Lightning's detect_anomaly). Default: false.
  TORCH_ARG(bool, detect_anomaly) = false;
  /// The value fit() gives LibTorch's cudnn.benchmark flag (at::globalContext().benchmarkCuDNN):
  /// cuDNN times and picks convolution algorithms on CUDA; no effect on the CPU (a note says
  /// so). Default: false.
  TORCH_ARG(bool, benchmark) = false;
  /// Profile fit, as Lightning's profiler argument: "simple" (or "true") prints the time per hook
  /// and loop phase on rank 0 when fit ends (SimpleProfiler); "pytorch" traces training batches
  /// 3 to 5 with LibTorch's profiler into a Chrome trace per rank under <log_dir>/profiler and
  /// prints its table (PyTorchProfiler); "" (or "false"): off. Default: "" (off).
  TORCH_ARG(std::string, profiler) = "";
  /// Before fit trains, run the LR finder (Tuner::lr_find with Lightning's defaults: 100 steps
  /// from 1e-8 to 1) and train with its suggestion; rank 0 writes <log_dir>/lr_find.csv for
  /// `lockstep plot`. Refused with ckpt_path. Default: false.
  TORCH_ARG(bool, lr_find) = false;
  /// Before fit trains (and before lr_find), find the largest training batch size that fits in
  /// memory: "power" or "binsearch" (Tuner::scale_batch_size with Lightning's defaults), and
  /// train with it. Refused with ckpt_path. Default: "" (off).
  TORCH_ARG(std::string, scale_batch_size) = "";
};

/// Gives every field still at its default the value of its LOCKSTEP_TRAINER_<FIELD> variable in
/// `environ`, when `options.trainer_variables()` is true (then sets it to false): what the Trainer's
/// constructor does with the process's variables. A bad value is a UsageError naming the variable.
void apply_trainer_variables(TrainerOptions& options, const environments::Environ& environ);

}  // namespace lockstep
