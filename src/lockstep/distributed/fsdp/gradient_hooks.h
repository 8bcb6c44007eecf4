#pragma once
// GradientHooks: calls around the accumulation of each parameter's gradient, for the sharded
// engine's backward (not installed).

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include <lockstep/core/libtorch_compat.h>

namespace lockstep {
namespace distributed {
namespace detail {

class GradientHooks {
 public:
  GradientHooks() = default;
  /// Removes every hook it added.
  ~GradientHooks();
  GradientHooks(const GradientHooks&) = delete;
  GradientHooks& operator=(const GradientHooks&) = delete;

  /// Hooks `parameter`'s gradient accumulator: `before` runs before a gradient is accumulated
  /// into it, `after` once it has been. The accumulator is made now and held, so that every
  /// backward's gradients are checked against (and cast to) the parameter's shape and dtype now.
  void add(const at::Tensor& parameter, std::function<void()> before, std::function<void()> after);
  /// Gives parameter `k` (the k-th added) its accumulator back: set_data to another dtype lets
  /// go of it.
  void reattach(size_t k, const at::Tensor& parameter) const;

 private:
  std::vector<libtorch::GradAccumulator> accumulators_;
  std::vector<uintptr_t> post_hook_keys_;
  std::vector<const void*> pre_hooks_;  // ours, one per accumulator
};

}  // namespace detail
}  // namespace distributed
}  // namespace lockstep
