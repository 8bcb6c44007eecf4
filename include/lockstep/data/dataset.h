#pragma once
/// Dataset: indexed examples that a DataLoader turns into batches.

#include <memory>
#include <vector>

#include <torch/types.h>

#include <lockstep/core/batch.h>

namespace lockstep {

/// Random-access examples. Implement `size()` and `get(index)`; override `get_batch` when a
/// whole batch can be gathered faster than one example at a time (TensorDataset does).
class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  /// One example: data without a batch dimension, target a scalar (or undefined).
  virtual Batch get(int64_t index) const = 0;
  /// The examples at `indices`, stacked along a new first dimension.
  virtual Batch get_batch(const std::vector<int64_t>& indices) const;
};

/// Examples held in memory as two tensors whose first dimension indexes examples.
///   auto ds = std::make_shared<TensorDataset>(torch::randn({100, 784}), torch::randint(10, {100}));
class TensorDataset : public Dataset {
 public:
  TensorDataset(torch::Tensor data, torch::Tensor target);
  int64_t size() const override { return data_.size(0); }
  Batch get(int64_t index) const override;
  Batch get_batch(const std::vector<int64_t>& indices) const override;

 private:
  torch::Tensor data_;
  torch::Tensor target_;
};

/// Adapts a torch::data dataset (anything with `get(size_t)` returning torch::data::Example<>
/// and `size()` returning an optional size) to a Lockstep Dataset.
template <typename TorchDataset>
class TorchDatasetAdapter : public Dataset {
 public:
  explicit TorchDatasetAdapter(TorchDataset dataset) : dataset_(std::move(dataset)) {}
  int64_t size() const override { return static_cast<int64_t>(dataset_.size().value()); }
  Batch get(int64_t index) const override {
    auto example = const_cast<TorchDataset&>(dataset_).get(static_cast<size_t>(index));
    return {example.data, example.target};
  }

 private:
  TorchDataset dataset_;
};

template <typename TorchDataset>
std::shared_ptr<Dataset> from_torch_dataset(TorchDataset dataset) {
  return std::make_shared<TorchDatasetAdapter<TorchDataset>>(std::move(dataset));
}

}  // namespace lockstep
