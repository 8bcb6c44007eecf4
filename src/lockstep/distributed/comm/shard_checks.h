#pragma once
// Checks the shard transports share (not installed).

#include <string>

#include <ATen/core/Tensor.h>

#include <lockstep/distributed/comm/shard_transport.h>
#include <lockstep/distributed/process_group.h>

namespace lockstep {
namespace distributed {
namespace detail {

/// UsageError unless the pieces of `flat` are contiguous, of the shard's dtype and device, in
/// ascending order, apart, inside the flat, and the flat holds world_size * shard.numel() elements
/// (check_equal_shards of a whole flat, equal_shards.h, for a flat given as pieces).
void check_equal_shards(int world_size, const std::string& who, const FlatSegments& flat, const at::Tensor& shard,
                        const std::string& call, const std::string& what);

/// Why shared memory cannot serve `group`, or "" if it may: `allowed` false (then "turned off " +
/// `off_by`), LOCKSTEP_DDP_SHARED_MEMORY=0, or a process group whose device is not the CPU.
std::string shared_memory_unsuitable(const ProcessGroup& group, bool allowed, const std::string& off_by);

}  // namespace detail
}  // namespace distributed
}  // namespace lockstep
