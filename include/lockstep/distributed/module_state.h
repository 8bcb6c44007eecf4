#pragma once
/// The checks and copies that make a module's replicas start equal: every data-parallel wrapper
/// (DistributedDataParallel, FullyShardedDataParallel) runs them when it wraps a module.

#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <lockstep/distributed/process_group.h>

namespace lockstep {
namespace distributed {

/// A collective: every rank compares its parameters (names, dtypes, shapes, requires_grad) with
/// rank 0's; on a mismatch every rank throws DistributedError naming `wrapper`, the first
/// differing parameter and the ranks that differ.
void verify_same_parameters(torch::nn::Module& module, ProcessGroup& group, const std::string& wrapper);

/// A collective: overwrites `tensors` on every rank with rank `src`'s, packed by dtype into
/// buckets of about 16 MiB (assign_buckets), one broadcast each; a bucket of one contiguous
/// tensor goes unpacked. `what` ("DDP parameters") names the call in errors.
void broadcast_tensors(ProcessGroup& group, const std::vector<at::Tensor>& tensors, const std::string& what,
                       int src = 0);

}  // namespace distributed
}  // namespace lockstep
