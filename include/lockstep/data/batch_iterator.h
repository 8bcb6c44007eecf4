#pragma once
/// BatchIterator: range-for over the batches of a loader's current epoch, as Python's
/// `for batch in loader`.

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <optional>

#include <lockstep/core/batch.h>

namespace lockstep {

/// Steps through loader.batch(0), loader.batch(1), ... up to loader.num_batches(); each batch is
/// loaded when first dereferenced, so the loader's prefetch of the next one keeps working:
///   loader.set_epoch(epoch);
///   for (Batch& batch : loader) train(batch);
/// `Loader` is DataLoader or FabricDataLoader (anything with batch(i) and num_batches()).
template <typename Loader>
class BatchIterator {
 public:
  using iterator_category = std::input_iterator_tag;
  using value_type = Batch;
  using difference_type = std::ptrdiff_t;
  using pointer = Batch*;
  using reference = Batch&;

  BatchIterator(Loader& loader, int64_t index) : loader_(&loader), index_(index) {}
  Batch& operator*() {
    if (!batch_) batch_ = loader_->batch(index_);
    return *batch_;
  }
  Batch* operator->() { return &**this; }
  BatchIterator& operator++() {
    ++index_;
    batch_.reset();
    return *this;
  }
  bool operator==(const BatchIterator& other) const { return loader_ == other.loader_ && index_ == other.index_; }
  bool operator!=(const BatchIterator& other) const { return !(*this == other); }
  /// The batch's index in the epoch (Lightning's batch_idx).
  int64_t index() const { return index_; }

 private:
  Loader* loader_;
  int64_t index_;
  std::optional<Batch> batch_;
};

}  // namespace lockstep
