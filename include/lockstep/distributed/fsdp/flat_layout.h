#pragma once
/// FlatLayout: how the parameters of one sharded unit lie in one flat buffer, and which part of
/// it each rank owns (PyTorch FSDP's FlatParameter layout).

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

namespace lockstep {
namespace distributed {

/// Parameter i occupies [offsets[i], offsets[i] + numels[i]) of the flat buffer, in order and
/// without gaps; the buffer is padded with zeros to shard_numel * world_size elements, and rank r
/// owns [r * shard_numel, (r + 1) * shard_numel). So every rank's shard has the same size and
/// the last ranks' shards end in padding (or are all padding, for a unit smaller than the world).
///
///   auto layout = FlatLayout::of(unit_parameters, group.world_size());
///   auto piece = layout.piece(0, group.rank());  // parameter 0's elements this rank owns
struct FlatLayout {
  std::vector<std::vector<int64_t>> shapes;
  std::vector<int64_t> numels;
  std::vector<int64_t> offsets;
  /// The parameters' elements together (no padding).
  int64_t numel = 0;
  /// Each rank's elements: ceil(numel / world_size), at least 1.
  int64_t shard_numel = 1;
  int world_size = 1;

  static FlatLayout of(const std::vector<at::Tensor>& parameters, int world_size);
  int64_t padded_numel() const { return shard_numel * world_size; }

  /// The elements of parameter `i` (counted in its flattened order) that rank `rank` owns:
  /// [begin, begin + numel), stored at shard_offset in that rank's shard. numel may be 0.
  struct Piece {
    int64_t begin = 0;
    int64_t numel = 0;
    int64_t shard_offset = 0;
  };
  Piece piece(size_t i, int rank) const;
};

}  // namespace distributed
}  // namespace lockstep
