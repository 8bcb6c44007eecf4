#include <lockstep/distributed/bucket_assignment.h>
#include <lockstep/core/error.h>

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>

namespace lockstep {
namespace distributed {
namespace {

struct OpenBucket {
  std::vector<size_t> members;
  int64_t bytes = 0;
  bool first = true;  // still this dtype's first bucket
};

}  // namespace

std::vector<std::vector<size_t>> assign_buckets(const std::vector<at::Tensor>& tensors,
                                                const std::vector<size_t>& order,
                                                int64_t first_bucket_bytes, int64_t bucket_bytes) {
  std::vector<std::vector<size_t>> buckets;
  std::map<at::ScalarType, OpenBucket> open;
  std::vector<size_t> position(tensors.size(), tensors.size());
  for (size_t k = 0; k < order.size(); ++k) {
    const size_t i = order[k];
    if (i >= tensors.size() || position[i] != tensors.size()) {
      throw UsageError("assign_buckets: order must list each of the " + std::to_string(tensors.size()) +
                                  " tensors once; index " + std::to_string(i) + " is out of range or repeated.");
    }
    position[i] = k;
    auto& bucket = open[tensors[i].scalar_type()];
    bucket.members.push_back(i);
    bucket.bytes += static_cast<int64_t>(tensors[i].numel() * tensors[i].element_size());
    const int64_t cap = bucket.first ? first_bucket_bytes : bucket_bytes;
    if (bucket.bytes >= cap) {
      buckets.push_back(std::move(bucket.members));
      bucket = OpenBucket{{}, 0, false};
    }
  }
  if (order.size() != tensors.size()) {
    throw UsageError("assign_buckets: order lists " + std::to_string(order.size()) + " of " +
                                std::to_string(tensors.size()) + " tensors; it must list each once.");
  }
  for (auto& entry : open) {
    if (!entry.second.members.empty()) buckets.push_back(std::move(entry.second.members));
  }
  std::sort(buckets.begin(), buckets.end(), [&](const std::vector<size_t>& a, const std::vector<size_t>& b) {
    return position[a.front()] < position[b.front()];
  });
  return buckets;
}

std::vector<size_t> reverse_order(size_t n) {
  std::vector<size_t> order(n);
  for (size_t k = 0; k < n; ++k) order[k] = n - 1 - k;
  return order;
}

}  // namespace distributed
}  // namespace lockstep
