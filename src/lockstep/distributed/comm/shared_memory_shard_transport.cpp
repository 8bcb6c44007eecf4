#include <lockstep/distributed/comm/shared_memory_shard_transport.h>

#include <algorithm>
#include <cstring>

#include <torch/torch.h>

#include <lockstep/core/error.h>
#include <lockstep/distributed/collectives.h>

#include "futex_barrier.h"
#include "hosts.h"
#include "shared_memory_segment.h"
#include "../equal_shards.h"
#include "../rank_order_sum.h"
#include "shard_checks.h"

namespace lockstep {
namespace distributed {
namespace {

// What shared memory sums and copies itself; anything else goes through c10d.
bool shared_memory_takes(const at::Tensor& t) {
  const auto dtype = t.scalar_type();
  return t.device().is_cpu() && t.is_contiguous() &&
         (dtype == at::kFloat || dtype == at::kDouble || dtype == at::kBFloat16);
}

// Elements from, ..., from + count - 1 of `flat` into `to`: copied from the segments, zero between them.
template <typename T>
void copy_range(const FlatSegments& flat, int64_t from, int64_t count, T* to) {
  const int64_t end = from + count;
  int64_t at = from;
  for (size_t i = 0; i < flat.tensors.size() && at < end; ++i) {
    const int64_t start = flat.offsets[i];
    const int64_t stop = start + flat.tensors[i].numel();
    if (stop <= at) continue;
    if (start >= end) break;
    if (start > at) std::fill(to + (at - from), to + (start - from), T(0));
    at = std::max(at, start);
    const int64_t n = std::min(stop, end) - at;
    std::memcpy(to + (at - from), flat.tensors[i].data_ptr<T>() + (at - start), static_cast<size_t>(n) * sizeof(T));
    at += n;
  }
  if (at < end) std::fill(to + (at - from), to + count, T(0));
}

}  // namespace

// This rank's mapping of its host's segment, and the barrier in the segment's header.
struct SharedMemoryShardTransport::Segment {
  Segment(std::unique_ptr<detail::SharedMemorySegment> mapped, const std::vector<int>& members, int local_rank,
          std::chrono::milliseconds timeout)
      : memory(std::move(mapped)), barrier(memory->header(), members, local_rank, timeout) {}

  template <typename T>
  T* slot(int rank) const {
    return reinterpret_cast<T*>(memory->slot(rank));
  }

  std::unique_ptr<detail::SharedMemorySegment> memory;
  detail::FutexBarrier barrier;
};

std::shared_ptr<SharedMemoryShardTransport> SharedMemoryShardTransport::connect(ProcessGroup& group,
                                                                                int64_t max_flat_bytes,
                                                                                const std::string& refused,
                                                                                std::string* why_not,
                                                                                const std::string& host) {
  if (group.world_size() < 2) {
    if (why_not) *why_not = "a single rank has nothing to share";
    return nullptr;
  }
  // One host only: across hosts a reduce-scatter needs no sum of sums, so c10d does it whole.
  auto joined = detail::join_host_segment(group, detail::slot_bytes_for(max_flat_bytes), refused, host,
                                          "sharding shared memory", true, why_not);
  if (!joined.memory) return nullptr;
  auto segment = std::make_unique<Segment>(std::move(joined.memory), joined.members, joined.local_rank,
                                           group.timeout());
  // Every rank's pid is in the header before any barrier looks at it.
  distributed::barrier(group, "sharding shared memory attached");
  return std::shared_ptr<SharedMemoryShardTransport>(new SharedMemoryShardTransport(
      std::move(segment), group.rank(), group.world_size(), group.describe(), c10d_shard_transport(group)));
}

SharedMemoryShardTransport::SharedMemoryShardTransport(std::unique_ptr<Segment> segment, int rank, int world_size,
                                                       std::string who, std::shared_ptr<ShardTransport> fallback)
    : segment_(std::move(segment)),
      rank_(rank),
      world_size_(world_size),
      who_(std::move(who)),
      fallback_(std::move(fallback)) {}

SharedMemoryShardTransport::~SharedMemoryShardTransport() { leave(); }

void SharedMemoryShardTransport::leave() {
  segment_->memory->header().left[rank_].store(1, std::memory_order_release);
}

int64_t SharedMemoryShardTransport::slot_bytes() const { return segment_->memory->slot_bytes(); }

void SharedMemoryShardTransport::reduce_scatter(const FlatSegments& flat, at::Tensor& shard, double divisor,
                                                const std::string& what) {
  detail::check_equal_shards(world_size_, who_, flat, shard, "reduce_scatter", what);
  if (!shared_memory_takes(shard)) return fallback_->reduce_scatter(flat, shard, divisor, what);
  reduce_scatter_typed(flat, shard, divisor, what, false);
}

void SharedMemoryShardTransport::reduce_scatter_add(const FlatSegments& flat, at::Tensor& shard, double divisor,
                                                    const std::string& what) {
  detail::check_equal_shards(world_size_, who_, flat, shard, "reduce_scatter", what);
  if (!shared_memory_takes(shard)) return fallback_->reduce_scatter_add(flat, shard, divisor, what);
  reduce_scatter_typed(flat, shard, divisor, what, true);
}

void SharedMemoryShardTransport::reduce_scatter_typed(const FlatSegments& flat, at::Tensor& shard, double divisor,
                                                      const std::string& what, bool add) {
  if (!broken_.empty()) fail(what, "an earlier call failed: " + broken_);
  if (shard.scalar_type() == at::kFloat) {
    reduce_scatter_in_chunks<float>(flat, shard.data_ptr<float>(), shard.numel(), static_cast<float>(divisor), what,
                                 add);
  } else if (shard.scalar_type() == at::kBFloat16) {
    reduce_scatter_in_chunks<c10::BFloat16>(flat, shard.data_ptr<c10::BFloat16>(), shard.numel(),
                                         c10::BFloat16(static_cast<float>(divisor)), what, add);
  } else {
    reduce_scatter_in_chunks<double>(flat, shard.data_ptr<double>(), shard.numel(), divisor, what, add);
  }
}

void SharedMemoryShardTransport::all_gather(const at::Tensor& shard, at::Tensor& flat, const std::string& what) {
  detail::check_equal_shards(world_size_, who_, flat, shard, "all_gather", what);
  if (!shared_memory_takes(flat)) return fallback_->all_gather(shard, flat, what);
  if (!broken_.empty()) fail(what, "an earlier call failed: " + broken_);
  if (flat.scalar_type() == at::kFloat) {
    all_gather_in_chunks<float>(shard.data_ptr<float>(), flat.data_ptr<float>(), shard.numel(), what);
  } else if (flat.scalar_type() == at::kBFloat16) {
    all_gather_in_chunks<c10::BFloat16>(shard.data_ptr<c10::BFloat16>(), flat.data_ptr<c10::BFloat16>(), shard.numel(),
                                     what);
  } else {
    all_gather_in_chunks<double>(shard.data_ptr<double>(), flat.data_ptr<double>(), shard.numel(), what);
  }
}

// Chunk by chunk: the same `count` elements of every rank's part of the flat at a time, so that a
// slot holds world_size chunks; a flat that fits goes in one chunk.
template <typename T>
void SharedMemoryShardTransport::reduce_scatter_in_chunks(const FlatSegments& flat, T* shard, int64_t shard_numel,
                                                       T divisor, const std::string& what, bool add) {
  const int64_t slot_elements = slot_bytes() / static_cast<int64_t>(sizeof(T));
  const int64_t chunk = std::min(shard_numel, slot_elements / world_size_);
  announce(Operation::reduce_scatter, shard_numel, c10::CppTypeToScalarType<T>::value);
  for (int64_t begin = 0; begin < shard_numel; begin += chunk) {
    const int64_t count = std::min(chunk, shard_numel - begin);
    T* mine = segment_->slot<T>(rank_);
    for (int r = 0; r < world_size_; ++r) copy_range<T>(flat, r * shard_numel + begin, count, mine + r * count);
    barrier(what, "flats written");
    if (begin == 0) check_same_call(what);
    std::vector<const T*> parts;
    for (int r = 0; r < world_size_; ++r) parts.push_back(segment_->slot<T>(r) + rank_ * count);
    detail::sum_in_rank_order<T>(parts, shard + begin, count, divisor, add);
    // No rank writes its slot again before every rank has read its part of it.
    barrier(what, "shards summed");
  }
}

template <typename T>
void SharedMemoryShardTransport::all_gather_in_chunks(const T* shard, T* flat, int64_t shard_numel,
                                                   const std::string& what) {
  const int64_t chunk = std::min(shard_numel, slot_bytes() / static_cast<int64_t>(sizeof(T)));
  announce(Operation::all_gather, shard_numel, c10::CppTypeToScalarType<T>::value);
  for (int64_t begin = 0; begin < shard_numel; begin += chunk) {
    const int64_t count = std::min(chunk, shard_numel - begin);
    const size_t bytes = static_cast<size_t>(count) * sizeof(T);
    std::memcpy(segment_->slot<T>(rank_), shard + begin, bytes);
    barrier(what, "shards written");
    if (begin == 0) check_same_call(what);
    for (int r = 0; r < world_size_; ++r) {
      T* to = flat + r * shard_numel + begin;
      const T* from = r == rank_ ? shard + begin : segment_->slot<T>(r);
      if (to != from) std::memcpy(to, from, bytes);  // `shard` may be this rank's part of `flat`
    }
    barrier(what, "shards copied");
  }
}

void SharedMemoryShardTransport::announce(Operation operation, int64_t shard_numel, at::ScalarType dtype) {
  // Read by the others only between this call's first two barriers.
  int64_t* mine = segment_->memory->header().job[rank_];
  mine[0] = static_cast<int64_t>(operation);
  mine[1] = shard_numel;
  mine[2] = static_cast<int64_t>(dtype);
}

void SharedMemoryShardTransport::check_same_call(const std::string& what) {
  const auto describe = [](const int64_t* job) {
    return std::string(job[0] == static_cast<int64_t>(Operation::reduce_scatter) ? "reduce_scatter" : "all_gather") +
           " of " + std::to_string(job[1]) + " " + c10::toString(static_cast<at::ScalarType>(job[2])) +
           " values per rank";
  };
  const auto& job = segment_->memory->header().job;
  for (int r = 0; r < world_size_; ++r) {
    if (std::equal(job[rank_], job[rank_] + 3, job[r])) continue;
    fail(what, "ranks are in different calls: rank " + std::to_string(rank_) + " in " + describe(job[rank_]) +
                   ", rank " + std::to_string(r) + " in " + describe(job[r]) +
                   ". Every rank must make the same calls in the same order.");
  }
}

void SharedMemoryShardTransport::barrier(const std::string& what, const char* phase) {
  const std::string failure = segment_->barrier.wait(phase, ++epoch_, stopping_);
  if (!failure.empty()) fail(what, failure);
}

void SharedMemoryShardTransport::fail(const std::string& what, const std::string& failure) {
  uint32_t none = 0;
  segment_->memory->header().aborted_by.compare_exchange_strong(none, static_cast<uint32_t>(rank_ + 1));
  if (broken_.empty()) broken_ = failure;
  throw DistributedError(who_ + ": " + what + " through shared memory: " + failure);
}

}  // namespace distributed
}  // namespace lockstep
