#pragma once
/// IdxDatasetOptions: which IDX files IdxDataset reads and how it shapes and scales the pixels.

#include <string>

#include <torch/arg.h>

namespace lockstep {
namespace data {

/// Where Debian's dataset-fashion-mnist package puts the four gzip'd IDX files.
constexpr const char* kFashionMnistDirectory = "/usr/share/datasets/fashion-mnist";

/// The training files (train-*) or the test files (t10k-*).
enum class Split { Train, Test };

/// Options for IdxDataset. Defaults read Fashion-MNIST's training split from Debian's package
/// and normalise with its mean and standard deviation.
///   IdxDataset test(IdxDatasetOptions().split(Split::Test).flatten(true));
struct IdxDatasetOptions {
  IdxDatasetOptions() = default;
  explicit IdxDatasetOptions(std::string directory) : directory_(std::move(directory)) {}

  /// Directory holding `train-images-idx3-ubyte`, `train-labels-idx1-ubyte`,
  /// `t10k-images-idx3-ubyte`, `t10k-labels-idx1-ubyte`, each gzip'd (`.gz`, preferred when
  /// both exist) or plain. Default kFashionMnistDirectory.
  TORCH_ARG(std::string, directory) = kFashionMnistDirectory;
  /// Which files: Split::Train (train-*) or Split::Test (t10k-*). Default Train.
  TORCH_ARG(Split, split) = Split::Train;
  /// Pixels are scaled to [0, 1]; with normalize they then become (x - mean) / stddev.
  /// Default true.
  TORCH_ARG(bool, normalize) = true;
  /// Mean subtracted when normalising. Default 0.2860 (Fashion-MNIST; MNIST is 0.1307).
  TORCH_ARG(double, mean) = 0.2860;
  /// Standard deviation divided by when normalising. Default 0.3530 (MNIST: 0.3081).
  TORCH_ARG(double, stddev) = 0.3530;
  /// Each image as a flat vector of rows*cols floats (784) instead of 1 x rows x cols, the
  /// shape torchvision gives. Default false.
  TORCH_ARG(bool, flatten) = false;
};

}  // namespace data
}  // namespace lockstep
