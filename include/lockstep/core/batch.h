#pragma once
/// Batch: what a loader yields and a step receives, and moving batches between devices.

#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <torch/types.h>

namespace lockstep {

/// A batch of examples: inputs and targets (an undefined target for unlabelled data).
struct Batch {
  torch::Tensor data;
  torch::Tensor target;
  /// Number of examples (the first dimension of data).
  int64_t size() const { return data.defined() ? data.size(0) : 0; }
};

/// Moves tensors to `device`, recursing into vectors, tuples, pairs, maps and Batch. A user
/// struct joins in by declaring `to_device(MyStruct&, const torch::Device&)` in its own
/// namespace (found by argument-dependent lookup), or by overriding
/// TrainingModule::transfer_batch_to_device.
inline void to_device(torch::Tensor& t, const torch::Device& device) {
  if (t.defined() && t.device() != device) t = t.to(device, /*non_blocking=*/true);
}
inline void to_device(Batch& b, const torch::Device& device) {
  to_device(b.data, device);
  to_device(b.target, device);
}
template <typename T>
void to_device(std::vector<T>& items, const torch::Device& device);
template <typename K, typename V>
void to_device(std::map<K, V>& items, const torch::Device& device);
template <typename A, typename B>
void to_device(std::pair<A, B>& items, const torch::Device& device);
template <typename... T>
void to_device(std::tuple<T...>& items, const torch::Device& device);

template <typename T>
void to_device(std::vector<T>& items, const torch::Device& device) {
  for (auto& item : items) to_device(item, device);
}
template <typename K, typename V>
void to_device(std::map<K, V>& items, const torch::Device& device) {
  for (auto& entry : items) to_device(entry.second, device);
}
template <typename A, typename B>
void to_device(std::pair<A, B>& items, const torch::Device& device) {
  to_device(items.first, device);
  to_device(items.second, device);
}
template <typename... T>
void to_device(std::tuple<T...>& items, const torch::Device& device) {
  std::apply([&](auto&... item) { (to_device(item, device), ...); }, items);
}

}  // namespace lockstep
