#pragma once
/// How DDP groups parameters into gradient buckets.

#include <cstddef>
#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

namespace lockstep {
namespace distributed {

/// Groups `tensors` into buckets, visiting them in `order` (indices into `tensors`; DDP passes
/// reverse registration order, the order gradients usually arrive in). A bucket holds one dtype;
/// it closes once it holds at least `first_bucket_bytes` (the first bucket of each dtype) or
/// `bucket_bytes` (the others). Each bucket lists its tensors in visiting order, and buckets are
/// ordered by their first tensor's position in `order`.
///
///   assign_buckets(params, {2, 1, 0}, 1 << 20, 25 << 20);  // -> {{2, 1}, {0}} for example
std::vector<std::vector<size_t>> assign_buckets(const std::vector<at::Tensor>& tensors,
                                                const std::vector<size_t>& order,
                                                int64_t first_bucket_bytes, int64_t bucket_bytes);

/// Indices 0..n-1 from last to first: the default visiting order.
std::vector<size_t> reverse_order(size_t n);

}  // namespace distributed
}  // namespace lockstep
