#pragma once
/// IdxDataset: MNIST-format image classification data (MNIST, Fashion-MNIST, KMNIST) read from
/// IDX files, gzip'd or plain, as a torch::data dataset.

#include <array>
#include <cstddef>
#include <string>
#include <vector>

#include <torch/data/datasets/base.h>
#include <torch/data/example.h>
#include <torch/types.h>

#include <lockstep/data/idx_dataset_options.h>

namespace lockstep {
namespace data {

/// Every image and label is read at construction and kept as bytes (60,000 28x28 images are
/// 47 MB, a quarter of the float32 size); get() and gather() turn bytes into floats through a
/// 256-entry table of the scaled and normalised values, which is as fast as copying floats and
/// gives the same numbers as `(x / 255.0f - mean) / stddev` in float32. Examples are new tensors:
/// data float32 [rows*cols] or [1, rows, cols], target an int64 scalar (the class label).
///
/// Throws UsageError naming the file for a missing file (with how to install Debian's
/// dataset-fashion-mnist), a bad magic number, data shorter or longer than the header declares,
/// a damaged gzip stream, and image and label files that count different examples.
///   auto train = IdxDataset(IdxDatasetOptions().flatten(true)).map(torch::data::transforms::Stack<>());
///   auto loader = torch::data::make_data_loader(std::move(train), 64);
class IdxDataset : public torch::data::datasets::Dataset<IdxDataset> {
 public:
  /// Reads the split's two files from options.directory().
  explicit IdxDataset(IdxDatasetOptions options = IdxDatasetOptions());
  /// Reads the given image and label files (options.directory() and split() are not used).
  IdxDataset(const std::string& images_path, const std::string& labels_path,
             IdxDatasetOptions options = IdxDatasetOptions());

  /// Example `index` (0 <= index < size(); a UsageError naming the index and the size otherwise).
  torch::data::Example<> get(size_t index) override;
  c10::optional<size_t> size() const override;

  /// The examples at `indices` stacked: data [B, rows*cols] or [B, 1, rows, cols], target [B].
  /// One call instead of B get()s and a Stack; the order follows `indices`.
  torch::data::Example<> gather(const std::vector<int64_t>& indices) const;

  /// All images as read, uint8 [N, rows, cols].
  const torch::Tensor& images() const { return images_; }
  /// All labels, int64 [N].
  const torch::Tensor& labels() const { return labels_; }
  /// Image height and width (28 and 28 for MNIST).
  int64_t rows() const { return images_.size(1); }
  int64_t cols() const { return images_.size(2); }
  /// The image and label files this dataset was read from.
  const std::string& images_path() const { return images_path_; }
  const std::string& labels_path() const { return labels_path_; }
  const IdxDatasetOptions& options() const { return options_; }

 private:
  void load(const std::string& images_path, const std::string& labels_path);
  void fill(int64_t index, float* out) const;
  std::vector<int64_t> example_shape() const;

  IdxDatasetOptions options_;
  std::string images_path_;
  std::string labels_path_;
  torch::Tensor images_;
  torch::Tensor labels_;
  std::array<float, 256> pixel_value_{};
};

}  // namespace data
}  // namespace lockstep
