#pragma once
/// TrainerOptions: everything a Trainer run is configured by. Every field is also a command-line
/// flag (`--max-epochs`) and an environment variable (`LOCKSTEP_TRAINER_MAX_EPOCHS`); see
/// cli/trainer_flags.h.

#include <cstdint>
#include <string>

#include <torch/arg.h>

namespace lockstep {

///   Trainer trainer(TrainerOptions().devices("2").strategy("ddp").max_epochs(3));
struct TrainerOptions {
  /// auto|cpu|cuda|gpu. Default: "auto" (cuda if LibTorch sees one, else cpu).
  TORCH_ARG(std::string, accelerator) = "auto";
  /// auto, a count N, -1 (all GPUs), or GPU ids "0,2" / "[0, 1]". On CPU, N processes. Default: "auto".
  TORCH_ARG(std::string, devices) = "auto";
  /// auto|single_device|ddp|ddp_fork|ddp_find_unused_parameters_true|... Default: "auto".
  TORCH_ARG(std::string, strategy) = "auto";
  /// With a device count (--devices 2, -1, auto) on cuda: pick devices that are free now by
  /// probing each, retrying with jittered backoff when too few are (device ids given
  /// explicitly are used as given). Ignored on cpu. Default: false.
  TORCH_ARG(bool, auto_select_gpus) = false;
  /// Nodes in the job. Default: 1.
  TORCH_ARG(int, num_nodes) = 1;
  /// 32-true|64-true|bf16-mixed|16-mixed. Default: "32-true".
  TORCH_ARG(std::string, precision) = "32-true";
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
  /// Deterministic algorithms only, so equal flags give equal bits. Default: false.
  TORCH_ARG(bool, deterministic) = false;
  /// Where logs and checkpoints go. Default: "." (as Lightning's current directory).
  TORCH_ARG(std::string, default_root_dir) = ".";
  /// Checkpoint to resume from, or "last". Default: "" (start fresh).
  TORCH_ARG(std::string, ckpt_path) = "";
  /// Replace BatchNorm layers by SyncBatchNorm under DDP. Default: false.
  TORCH_ARG(bool, sync_batchnorm) = false;
  /// Fraction ("0.25") or count ("10") of training batches per epoch. Default: "1.0".
  TORCH_ARG(std::string, limit_train_batches) = "1.0";
  /// Fraction or count of validation batches. Default: "1.0".
  TORCH_ARG(std::string, limit_val_batches) = "1.0";
  /// Fraction or count of test batches. Default: "1.0".
  TORCH_ARG(std::string, limit_test_batches) = "1.0";
  /// Validate within the training epoch: a fraction in (0, 1] of the epoch's batches ("0.25":
  /// four times an epoch) or a count of training batches ("100": after every 100th). Default: "1.0".
  TORCH_ARG(std::string, val_check_interval) = "1.0";
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
  /// Put a DistributedSampler on the loaders under DDP. Default: true.
  TORCH_ARG(bool, use_distributed_sampler) = true;
  /// gloo|nccl|mpi; "" picks gloo on cpu, nccl on cuda. Default: "".
  TORCH_ARG(std::string, process_group_backend) = "";
  /// Seconds any collective may block before it fails, naming itself. Default: 1800.
  TORCH_ARG(double, timeout) = 1800.0;
  /// off|detail: with detail the ranks compare each collective's call (operation, tag, dtype,
  /// shape, number) before running it, and a difference stops every rank naming both calls (as
  /// LOCKSTEP_DISTRIBUTED_DEBUG=detail, PyTorch's TORCH_DISTRIBUTED_DEBUG). Default: "off".
  TORCH_ARG(std::string, distributed_debug) = "off";
  /// Self-launch (--devices N on this machine): after a failure, end every rank and start the
  /// program again, up to this many times (torchrun's --max-restarts); give --ckpt-path last to
  /// continue where it was. Under another launcher use its own restarts. Default: 0.
  TORCH_ARG(int64_t, max_restarts) = 0;
  /// Autograd's anomaly mode during fit: a backward that makes a NaN names the operation whose
  /// forward made it (slow; for debugging, as Lightning's detect_anomaly). Default: false.
  TORCH_ARG(bool, detect_anomaly) = false;
  /// The value fit() gives LibTorch's cudnn.benchmark flag (at::globalContext().benchmarkCuDNN):
  /// cuDNN times and picks convolution algorithms on CUDA; no effect on the CPU (a note says
  /// so). Default: false.
  TORCH_ARG(bool, benchmark) = false;
  /// Print the time spent per hook and loop phase at the end of fit. Default: false.
  TORCH_ARG(bool, profiler) = false;
};

}  // namespace lockstep
