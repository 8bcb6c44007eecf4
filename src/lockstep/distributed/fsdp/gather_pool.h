#pragma once
// GatherPool: the memory of a resharded unit's gathered parameters, handed to the next gather if
// that unit has the same size, instead of going back to the system and being faulted in afresh.
// It holds memory only until the next gather starts, which frees what it does not take (not
// installed).

#include <cstddef>
#include <mutex>
#include <utility>
#include <vector>

#include <c10/core/Allocator.h>

namespace lockstep {
namespace distributed {
namespace detail {

class GatherPool {
 public:
  /// Keeps at most `bytes` of free buffers from now on; 0 keeps none.
  void set_limit(size_t bytes);
  /// A kept buffer of exactly `bytes`, or an empty DataPtr; frees every other kept buffer.
  at::DataPtr take(size_t bytes);
  /// Frees every kept buffer.
  void clear();
  /// Keeps `data`, a buffer of `bytes`, for a later take(); frees it where the limit is reached.
  void give(at::DataPtr data, size_t bytes);

 private:
  std::mutex mutex_;  // forward gives and takes on the training thread, backward takes in autograd's hooks
  std::vector<std::pair<size_t, at::DataPtr>> free_;
  size_t limit_ = 0;
  size_t kept_ = 0;
};

}  // namespace detail
}  // namespace distributed
}  // namespace lockstep
