#pragma once
/// ShardTransport: the two collectives of sharded training, on flat buffers whose shards are
/// equal (FlatLayout pads them): reduce-scatter of gradients, all-gather of parameters. c10d
/// (Gloo: an all-to-all and a sum in rank order; NCCL: its own reduce-scatter and all-gather), or
/// shared memory between the ranks of one host.

#include <cstdint>
#include <memory>
#include <string>

#include <ATen/core/Tensor.h>

#include <lockstep/distributed/process_group.h>

namespace lockstep {
namespace distributed {

class ShardTransport {
 public:
  virtual ~ShardTransport() = default;
  /// Names it in messages: "shared memory", or the process group's backend ("gloo").
  virtual std::string name() const = 0;
  /// `flat` (world_size * shard.numel() elements, the same on every rank) summed over the ranks
  /// in rank order and divided by `divisor`; this rank's part (rank * shard.numel(), ...) is
  /// written to `shard`. Blocks until done; fails with DistributedError after the group's timeout
  /// naming `what` (e.g. "reduce_scatter of unit 3's gradients"), this rank and the ranks missing.
  virtual void reduce_scatter(const at::Tensor& flat, at::Tensor& shard, double divisor, const std::string& what) = 0;
  /// Every rank's `shard` (the same numel on every rank) into `flat`, in rank order. `shard` may
  /// be this rank's part of `flat` itself. Blocks, and fails as reduce_scatter does.
  virtual void all_gather(const at::Tensor& shard, at::Tensor& flat, const std::string& what) = 0;
};

/// The process group's backend: a collective of `group` for every rank. Gloo: an all-to-all of
/// the parts, then the sum in rank order ((x0 + x1) + x2 ...; the same bits as shared memory),
/// and an all-gather; NCCL: its reduce-scatter and all-gather on group.device(). Waits are bounded
/// by the group's timeout. `group` must outlive it.
std::shared_ptr<ShardTransport> c10d_shard_transport(ProcessGroup& group);

/// Shared memory when every rank can use it (`shared_memory` true, more than one rank, all on
/// this host, the group's device the CPU, LOCKSTEP_DDP_SHARED_MEMORY not 0), else c10d; with
/// several hosts, c10d. A collective: every rank of `group` calls it with the same
/// `max_flat_bytes` (the segment holds that much per rank; larger flats go through in pieces).
/// `why_not` (may be null) receives why shared memory is not used, "" when it is. In shared
/// memory, tensors other than contiguous CPU float32, float64 and bfloat16 go through c10d.
///
///   std::string why_not;
///   auto transport = choose_shard_transport(group, layout.padded_numel() * 4, true, &why_not);
///   transport->reduce_scatter(flat_grad, grad_shard, group.world_size(), "reduce_scatter of unit 3");
std::shared_ptr<ShardTransport> choose_shard_transport(ProcessGroup& group, int64_t max_flat_bytes,
                                                       bool shared_memory, std::string* why_not);

}  // namespace distributed
}  // namespace lockstep
