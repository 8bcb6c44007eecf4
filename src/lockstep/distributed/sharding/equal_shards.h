#pragma once
// The c10d reduce-scatter and all-gather over equal shards, for the c10d shard transport and the
// collectives reduce_scatter and all_gather_into; and the sum in rank order that makes the Gloo
// and shared memory paths give the same bits (not installed).

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>

#include <lockstep/distributed/collectives.h>
#include <lockstep/distributed/process_group.h>
#include <lockstep/distributed/sharding/shard_transport.h>

namespace lockstep {
namespace distributed {
namespace detail {

/// out[i] = ((parts[0][i] + parts[1][i]) + ...) / divisor for i < n, in blocks that stay in
/// the cache; `out` may be none of the parts. `add`: out[i] += that instead, in the same steps as
/// a sum into a new tensor that is then added.
template <typename T>
void sum_in_rank_order(const std::vector<const T*>& parts, T* out, int64_t n, T divisor, bool add = false) {
  constexpr int64_t kBlock = 2048;
  alignas(64) T sum[kBlock];
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t count = std::min(kBlock, n - start);
    T* block = add ? sum : out + start;
    const T* first = parts[0] + start;
    for (int64_t i = 0; i < count; ++i) block[i] = first[i];
    for (size_t r = 1; r < parts.size(); ++r) {
      const T* other = parts[r] + start;
      for (int64_t i = 0; i < count; ++i) block[i] += other[i];
    }
    if (divisor != T(1)) {
      for (int64_t i = 0; i < count; ++i) block[i] /= divisor;
    }
    if (add) {
      for (int64_t i = 0; i < count; ++i) out[start + i] += block[i];
    }
  }
}

/// bfloat16: summed and divided in float32, rounded once (the bits of sum_rows_in_rank_order);
/// `add` adds that rounded value to out[i] in float32 and rounds again, as a bfloat16 add_ does.
template <>
inline void sum_in_rank_order<c10::BFloat16>(const std::vector<const c10::BFloat16*>& parts, c10::BFloat16* out,
                                             int64_t n, c10::BFloat16 divisor, bool add) {
  constexpr int64_t kBlock = 2048;
  float block[kBlock];
  const float by = static_cast<float>(divisor);
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t count = std::min(kBlock, n - start);
    for (int64_t i = 0; i < count; ++i) block[i] = static_cast<float>(parts[0][start + i]);
    for (size_t r = 1; r < parts.size(); ++r) {
      for (int64_t i = 0; i < count; ++i) block[i] += static_cast<float>(parts[r][start + i]);
    }
    if (by != 1.0f) {
      for (int64_t i = 0; i < count; ++i) block[i] /= by;
    }
    for (int64_t i = 0; i < count; ++i) {
      const c10::BFloat16 rounded(block[i]);
      out[start + i] = add ? c10::BFloat16(static_cast<float>(out[start + i]) + static_cast<float>(rounded)) : rounded;
    }
  }
}

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
/// The same for a flat given as pieces: each piece contiguous, of the shard's dtype and device, and
/// the pieces in ascending order, apart, inside the flat.
void check_equal_shards(int world_size, const std::string& who, const FlatPieces& flat, const at::Tensor& shard,
                        const std::string& call, const std::string& what);

}  // namespace detail
}  // namespace distributed
}  // namespace lockstep
