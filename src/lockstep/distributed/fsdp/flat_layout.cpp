#include <lockstep/distributed/fsdp/flat_layout.h>

#include <algorithm>

namespace lockstep {
namespace distributed {

FlatLayout FlatLayout::of(const std::vector<at::Tensor>& parameters, int world_size) {
  FlatLayout layout;
  layout.world_size = world_size;
  for (const auto& p : parameters) {
    layout.shapes.push_back(p.sizes().vec());
    layout.numels.push_back(p.numel());
    layout.offsets.push_back(layout.numel);
    layout.numel += p.numel();
  }
  layout.shard_numel = std::max<int64_t>(1, (layout.numel + world_size - 1) / world_size);
  return layout;
}

FlatLayout::Piece FlatLayout::piece(size_t i, int rank) const {
  const int64_t shard_begin = rank * shard_numel;
  const int64_t begin = std::max(offsets[i], shard_begin);
  const int64_t end = std::min(offsets[i] + numels[i], shard_begin + shard_numel);
  if (end <= begin) return Piece{0, 0, 0};
  return Piece{begin - offsets[i], end - begin, begin - shard_begin};
}

}  // namespace distributed
}  // namespace lockstep
