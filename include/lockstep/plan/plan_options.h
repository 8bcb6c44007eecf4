#pragma once
/// PlanOptions: where and how the processes of a job run (accelerator, devices, strategy, nodes,
/// precision, backend, timeout, ...), the options Trainer and Fabric share. TrainerOptions and
/// FabricOptions inherit them, so that `TrainerOptions().devices("2").max_epochs(3)` chains;
/// cli::add_plan_flags registers them as flags. resolve_plan (plan/connector.h) reads them. A
/// strategy's own settings (FSDP's sharding, DDP's buckets) are its constructor's arguments, or
/// those its registered name binds (fsdp_hybrid_shard).

#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include <torch/arg.h>

namespace lockstep {
namespace strategies {
class Strategy;
}

struct PlanOptions {
  /// auto|cpu|cuda|gpu. Default: "auto" (cuda if LibTorch sees one, else cpu).
  TORCH_ARG(std::string, accelerator) = "auto";
  /// auto, a count N, -1 (all GPUs), or GPU ids "0,2" / "[0, 1]". On CPU, N processes. auto: under
  /// a scheduler the processes it started per node (a GPU each, by local rank), else 1 on CPU and
  /// every visible GPU on CUDA. Default: "auto".
  TORCH_ARG(std::string, devices) = "auto";
  /// auto|single_device|ddp|ddp_fork|ddp_separate|ddp_find_unused_parameters_true|fsdp|
  /// fsdp_shard_grad_op|fsdp_hybrid_shard|... (the registered names). With a Strategy object
  /// (Trainer or Fabric set_strategy) it must stay "auto" or be that object's name; any other
  /// name is a UsageError. Default: "auto".
  TORCH_ARG(std::string, strategy) = "auto";
  /// With a device count (--devices 2, -1, auto) on cuda: pick devices that are free now by
  /// probing each, retrying with jittered backoff when too few are (device ids given
  /// explicitly are used as given). No effect on cpu (a note says so). Default: false.
  TORCH_ARG(bool, auto_select_gpus) = false;
  /// Nodes in the job. Default: 1.
  TORCH_ARG(int, num_nodes) = 1;
  /// 32-true|64-true|bf16-mixed|16-mixed. Default: "32-true".
  TORCH_ARG(std::string, precision) = "32-true";
  /// Replace BatchNorm layers by SyncBatchNorm under DDP. No effect with one process (a note
  /// says so). Default: false.
  TORCH_ARG(bool, sync_batchnorm) = false;
  /// gloo, or nccl (cuda only) where LibTorch has NCCL: the backends this build can create
  /// (distributed::available_backends()). mpi is refused: Lockstep builds no MPI process group,
  /// and under mpirun the ranks meet over gloo or nccl. "" picks gloo on cpu, nccl on cuda.
  /// Default: "".
  TORCH_ARG(std::string, process_group_backend) = "";
  /// Seconds any collective may block before it fails, naming itself. Default: 1800.
  TORCH_ARG(double, timeout) = 1800.0;
  /// Seconds after which a rank that stopped answering (its host gone, its process frozen) ends
  /// the job, naming it, however long `timeout` is; a slow step is not silence
  /// (ProcessGroupOptions::liveness_timeout). 0 turns the watch off. Default: 15.
  TORCH_ARG(double, liveness_timeout) = 15.0;
  /// off|detail: with detail the ranks compare each collective's call (operation, tag, dtype,
  /// shape, number) before running it, and a difference stops every rank naming both calls (as
  /// LOCKSTEP_DISTRIBUTED_DEBUG=detail, PyTorch's TORCH_DISTRIBUTED_DEBUG). Default: "off".
  TORCH_ARG(std::string, distributed_debug) = "off";
  /// Self-launch (--devices N on this machine): after a failure, end every rank and start the
  /// program again, up to this many times (torchrun's --max-restarts); give --ckpt-path last to
  /// continue where it was. Under another launcher use its own restarts. Default: 0.
  TORCH_ARG(int64_t, max_restarts) = 0;
  /// Called with the strategy the connector chose (by its name, or the object given to
  /// set_strategy) before the job starts, to set on it what its name does not; it throws
  /// UsageError for a strategy its settings do not fit. cli::add_plan_flags sets it from the
  /// --fsdp-* flags (cli/trainer_flags.h), keeping one set before. In code, give the strategy
  /// object its settings instead: set_strategy(std::make_shared<FSDPStrategy>(ShardingOptions()...)).
  /// Default: nullptr (none).
  TORCH_ARG(std::function<void(strategies::Strategy&)>, configure_strategy) = nullptr;
  /// Whether the Trainer or Fabric, when made, gives every field still at its default the value
  /// of its LOCKSTEP_TRAINER_<FIELD> variable (LOCKSTEP_TRAINER_DEVICES=2), as Lightning 2.x's
  /// PL_TRAINER_* do: a value set in code wins over the variable. cli::add_plan_flags sets it
  /// to false, as the flags read the variables themselves (order in cli/trainer_flags.h); so
  /// does reading them once. false: the environment is not read. Default: true.
  TORCH_ARG(bool, trainer_variables) = true;
};

/// PlanOptions whose setters return `Self&`: the base of TrainerOptions and FabricOptions.
template <typename Self>
struct PlanOptionsOf : PlanOptions {
// A setter that returns Self&, and the getters of PlanOptions.
#define LOCKSTEP_PLAN_OPTION(name)                     \
  template <typename T>                                \
  Self& name(T&& value) {                              \
    PlanOptions::name(std::forward<T>(value));         \
    return static_cast<Self&>(*this);                  \
  }                                                    \
  decltype(auto) name() const { return PlanOptions::name(); } \
  decltype(auto) name() { return PlanOptions::name(); }
  LOCKSTEP_PLAN_OPTION(accelerator)
  LOCKSTEP_PLAN_OPTION(devices)
  LOCKSTEP_PLAN_OPTION(strategy)
  LOCKSTEP_PLAN_OPTION(auto_select_gpus)
  LOCKSTEP_PLAN_OPTION(num_nodes)
  LOCKSTEP_PLAN_OPTION(precision)
  LOCKSTEP_PLAN_OPTION(sync_batchnorm)
  LOCKSTEP_PLAN_OPTION(process_group_backend)
  LOCKSTEP_PLAN_OPTION(timeout)
  LOCKSTEP_PLAN_OPTION(liveness_timeout)
  LOCKSTEP_PLAN_OPTION(distributed_debug)
  LOCKSTEP_PLAN_OPTION(max_restarts)
  LOCKSTEP_PLAN_OPTION(configure_strategy)
  LOCKSTEP_PLAN_OPTION(trainer_variables)
#undef LOCKSTEP_PLAN_OPTION
};

}  // namespace lockstep
