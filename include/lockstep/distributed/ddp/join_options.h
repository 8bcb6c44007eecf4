#pragma once
/// Options for Join, the context for training with uneven inputs.

#include <torch/arg.h>

namespace lockstep {
namespace distributed {

/// How a Join shadows the ranks that ran out of inputs; the defaults are PyTorch's
/// (torch.distributed.algorithms.Join and DistributedDataParallel.join()).
///
///   auto join = ddp.join(JoinOptions().divide_by_initial_world_size(false));
struct JoinOptions {
  /// When false the Join does nothing: every rank must then have the same number of inputs.
  /// Default: true.
  TORCH_ARG(bool, enable) = true;
  /// Instead of shadowing, fail on every rank (DistributedError) in the first iteration where
  /// some rank has run out of inputs. Default: false.
  TORCH_ARG(bool, throw_on_early_termination) = false;
  /// Average gradients over the world size the job started with, so that a joined rank counts
  /// as a zero gradient (true), or over the ranks that still have inputs in this iteration
  /// (false). Default: true.
  TORCH_ARG(bool, divide_by_initial_world_size) = true;
};

}  // namespace distributed
}  // namespace lockstep
