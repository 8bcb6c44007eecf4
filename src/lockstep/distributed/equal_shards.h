#pragma once
// The c10d reduce-scatter and all-gather over equal shards, for the collectives reduce_scatter and
// all_gather_into and the c10d shard transport of comm/ (not installed).

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include <lockstep/distributed/collectives.h>
#include <lockstep/distributed/process_group.h>

namespace lockstep {
namespace distributed {
namespace detail {

/// `rows` (world_size x shard.numel(): rank r's values in row r) summed in rank order and divided
/// by `divisor` into `shard`: sum_in_rank_order for contiguous CPU float32/float64, tensor
/// additions in the same order otherwise.
void sum_rows_in_rank_order(const at::Tensor& rows, at::Tensor& shard, double divisor);

/// ShardTransport::reduce_scatter over the group's backend, within the options' timeout
/// (`what` and the options' tag name it in errors).
void reduce_scatter_equal_shards(ProcessGroup& group, const at::Tensor& flat, at::Tensor& shard, double divisor,
                                 const std::string& what, const CollectiveOptions& options);
/// ShardTransport::all_gather over the group's backend, as reduce_scatter_equal_shards.
void all_gather_equal_shards(ProcessGroup& group, const at::Tensor& shard, at::Tensor& flat,
                             const std::string& what, const CollectiveOptions& options);

/// UsageError unless `flat` and `shard` are contiguous, of one dtype and device, and flat holds
/// world_size * shard.numel() elements; `who` ("rank 1/2") and `call` ("reduce_scatter") and
/// `what` name the call in the message.
void check_equal_shards(int world_size, const std::string& who, const at::Tensor& flat, const at::Tensor& shard,
                        const std::string& call, const std::string& what);
}  // namespace detail
}  // namespace distributed
}  // namespace lockstep
