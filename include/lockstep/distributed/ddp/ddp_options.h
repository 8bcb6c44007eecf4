#pragma once
/// Options for DistributedDataParallel.

#include <optional>

#include <torch/arg.h>

#include <lockstep/distributed/ddp/comm_hooks.h>

namespace lockstep {
namespace distributed {

/// How DistributedDataParallel buckets and reduces gradients; the defaults are PyTorch's.
///
///   DistributedDataParallel ddp(net, *group, DDPOptions().bucket_cap_mb(50).find_unused_parameters(true));
struct DDPOptions {
  /// Gradients are reduced in buckets of about this many MiB (a bucket closes once it reaches
  /// the cap), so that communication starts while backward still runs. Default: 25.
  TORCH_ARG(double, bucket_cap_mb) = 25;
  /// Cap of the first bucket, small so that the first allreduce starts early. Default: 1.
  TORCH_ARG(double, first_bucket_mb) = 1;
  /// Find, after each forward, the parameters that did not take part (a forward that skips a
  /// branch) and count them as ready with zero gradient. Costs a walk of the autograd graph per
  /// step; when false, a parameter without gradient is an error. Default: false, as in PyTorch
  /// and Lightning 2.x (Lightning 1.x's DDPPlugin defaulted to true; with the Trainer, --strategy
  /// ddp_find_unused_parameters_true gives that).
  TORCH_ARG(bool, find_unused_parameters) = false;
  /// Make each parameter's .grad() a view into its bucket, saving a copy and the memory of one
  /// set of gradients; the gradients' values are the same either way. Default: true (PyTorch's
  /// is false): the next backward overwrites a .grad() kept from an earlier step, so keep a
  /// clone(), or set false.
  TORCH_ARG(bool, gradient_as_bucket_view) = true;
  /// Broadcast rank 0's buffers (BatchNorm statistics, ...) before each training forward (grad
  /// mode on, module training). Default: unset, which DistributedDataParallel takes as true (as
  /// PyTorch) and SeparateDDP as false (as MMEditing's wrapper: each rank keeps its own), so
  /// options passed for another reason leave each wrapper's default as it is.
  TORCH_ARG(std::optional<bool>, broadcast_buffers) = std::nullopt;
  /// The set of used parameters and the order of their gradients is the same every step: the
  /// unused ones are found once, in the first step, and buckets follow the first step's order
  /// even with unused parameters. Default: false.
  TORCH_ARG(bool, static_graph) = false;
  /// When ranks share a host (and parameters are float32/float64 on the CPU), keep the buckets
  /// in memory shared by the ranks of each host and average them there instead of sending them
  /// through the backend (Gloo's loopback TCP): the sum in rank order (on 2 ranks the same bits
  /// as Gloo's) at a fraction of the CPU time (docs/benchmarks.md). With several hosts (the same number of ranks
  /// on each), rank i of every host then sums part i over the backend. Other collectives still
  /// use the backend. LOCKSTEP_DDP_SHARED_MEMORY=0 turns it off too. Default: true.
  TORCH_ARG(bool, shared_memory) = true;
  /// How a bucket is reduced. Default: allreduce_mean_hook().
  TORCH_ARG(CommHook, comm_hook) = allreduce_mean_hook();
};

}  // namespace distributed
}  // namespace lockstep
