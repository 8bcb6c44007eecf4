#include "gather_pool.h"

namespace lockstep {
namespace distributed {
namespace detail {

void GatherPool::set_limit(size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  limit_ = bytes;
}

at::DataPtr GatherPool::take(size_t bytes) {
  at::DataPtr data;
  std::vector<std::pair<size_t, at::DataPtr>> dropped;  // freed outside the lock
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& kept : free_) {
    if (!data && kept.first == bytes) {
      data = std::move(kept.second);
    } else {
      dropped.push_back(std::move(kept));
    }
  }
  free_.clear();
  kept_ = 0;
  return data;
}

void GatherPool::clear() {
  std::vector<std::pair<size_t, at::DataPtr>> dropped;
  std::lock_guard<std::mutex> lock(mutex_);
  dropped.swap(free_);
  kept_ = 0;
}

void GatherPool::give(at::DataPtr data, size_t bytes) {
  if (!data) return;
  std::unique_lock<std::mutex> lock(mutex_);
  if (kept_ + bytes > limit_) {
    lock.unlock();
    return;  // `data` frees its memory here
  }
  kept_ += bytes;
  free_.emplace_back(bytes, std::move(data));
}

}  // namespace detail
}  // namespace distributed
}  // namespace lockstep
