#pragma once
/// IdxExamples: an IdxDataset (MNIST / Fashion-MNIST files) as a Lockstep Dataset, gathering
/// whole batches at once.

#include <memory>

#include <lockstep/data/dataset.h>
#include <lockstep/data/idx_dataset.h>

namespace lockstep {
namespace data {

///   auto train = std::make_shared<IdxExamples>(IdxDatasetOptions().split(Split::Train).flatten(true));
///   DataLoader loader(train, DataLoaderOptions(64).shuffle(true));
class IdxExamples : public Dataset {
 public:
  explicit IdxExamples(IdxDatasetOptions options = IdxDatasetOptions())
      : idx_(std::make_shared<IdxDataset>(std::move(options))) {}
  int64_t size() const override { return static_cast<int64_t>(idx_->size().value()); }
  Batch get(int64_t index) const override {
    Batch one = get_batch({index});
    return {one.data[0], one.target[0]};
  }
  Batch get_batch(const std::vector<int64_t>& indices) const override {
    auto example = idx_->gather(indices);
    return {example.data, example.target};
  }
  const IdxDataset& idx() const { return *idx_; }

 private:
  std::shared_ptr<IdxDataset> idx_;
};

}  // namespace data
}  // namespace lockstep
