#include <lockstep/data/dataset.h>

#include <torch/torch.h>

#include <lockstep/core/error.h>

namespace lockstep {

Batch Dataset::get_batch(const std::vector<int64_t>& indices) const {
  std::vector<torch::Tensor> data, target;
  data.reserve(indices.size());
  for (int64_t i : indices) {
    Batch example = get(i);
    data.push_back(example.data);
    if (example.target.defined()) target.push_back(example.target);
  }
  return {torch::stack(data), target.empty() ? torch::Tensor() : torch::stack(target)};
}

TensorDataset::TensorDataset(torch::Tensor data, torch::Tensor target)
    : data_(std::move(data)), target_(std::move(target)) {
  if (target_.defined() && target_.size(0) != data_.size(0)) {
    throw UsageError("TensorDataset: data has " + std::to_string(data_.size(0)) + " examples but target has " +
                     std::to_string(target_.size(0)) + "; both first dimensions must count the same examples.");
  }
}

Batch TensorDataset::get(int64_t index) const {
  return {data_[index], target_.defined() ? target_[index] : torch::Tensor()};
}

Batch TensorDataset::get_batch(const std::vector<int64_t>& indices) const {
  auto index = torch::tensor(indices, torch::kInt64);
  return {data_.index_select(0, index), target_.defined() ? target_.index_select(0, index) : torch::Tensor()};
}

}  // namespace lockstep
