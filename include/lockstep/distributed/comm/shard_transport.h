#pragma once
/// ShardTransport: the two collectives of sharded training, on flat buffers whose shards are
/// equal (FlatLayout pads them): reduce-scatter of gradients, all-gather of parameters. c10d
/// (Gloo: an all-to-all and a sum in rank order; NCCL: its own reduce-scatter and all-gather), or
/// shared memory between the ranks of one host.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include <lockstep/distributed/process_group.h>

namespace lockstep {
namespace distributed {

/// A flat buffer given as the tensors it is made of, so that a reduce-scatter of gradients needs
/// no flat copy of them: `tensors[i]` (contiguous) holds the flat's elements from `offsets[i]`
/// on. Offsets ascend, the tensors do not overlap, and elements that no tensor holds are zero.
/// A tensor converts to the flat of one segment, itself.
struct FlatSegments {
  FlatSegments(const at::Tensor& flat);  // NOLINT(google-explicit-constructor): a flat is one segment
  FlatSegments(int64_t numel, std::vector<at::Tensor> tensors, std::vector<int64_t> offsets);
  /// One segment that is the whole flat.
  bool whole() const { return tensors.size() == 1 && offsets[0] == 0 && tensors[0].numel() == numel; }
  /// The flat as one tensor of `options`: the segment itself when it is whole(), else a copy.
  at::Tensor joined(const at::TensorOptions& options) const;

  int64_t numel;
  std::vector<at::Tensor> tensors;
  std::vector<int64_t> offsets;
};

class ShardTransport {
 public:
  virtual ~ShardTransport() = default;
  /// Names it in messages: "shared memory", or the process group's backend ("gloo").
  virtual std::string name() const = 0;
  /// `flat` (world_size * shard.numel() elements, the same on every rank) summed over the ranks
  /// in rank order and divided by `divisor`; this rank's part (rank * shard.numel(), ...) is
  /// written to `shard`. Blocks until done; fails with DistributedError after the group's timeout
  /// naming `what` (e.g. "reduce_scatter of unit 3's gradients"), this rank and the ranks missing.
  /// Shared memory reads the segments where they are; c10d joins them into one flat first.
  virtual void reduce_scatter(const FlatSegments& flat, at::Tensor& shard, double divisor, const std::string& what) = 0;
  /// reduce_scatter whose result is added to `shard` (a gradient shard that accumulates), with
  /// the bits of reduce_scatter into a new tensor and `shard.add_()` of it. This one does just
  /// that; shared memory adds each block as it sums it, without the tensor.
  virtual void reduce_scatter_add(const FlatSegments& flat, at::Tensor& shard, double divisor, const std::string& what);
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
/// `max_flat_bytes` (the segment holds that much per rank; larger flats go through in chunks).
/// `why_not` (may be null) receives why shared memory is not used, "" when it is. In shared
/// memory, tensors other than contiguous CPU float32, float64 and bfloat16 go through c10d.
/// (FlatSegments: a flat given as its segments, e.g. one gradient per parameter.)
///
///   std::string why_not;
///   auto transport = choose_shard_transport(group, layout.padded_numel() * 4, true, &why_not);
///   transport->reduce_scatter(flat_grad, grad_shard, group.world_size(), "reduce_scatter of unit 3");
std::shared_ptr<ShardTransport> choose_shard_transport(ProcessGroup& group, int64_t max_flat_bytes,
                                                       bool shared_memory, std::string* why_not);

}  // namespace distributed
}  // namespace lockstep
