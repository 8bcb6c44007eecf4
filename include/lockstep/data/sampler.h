#pragma once
/// DistributedSampler: each rank's share of the dataset indices for one epoch, exactly as
/// PyTorch's torch.utils.data.DistributedSampler computes them (same permutation for the same
/// seed and epoch, same padding), so Lockstep and Python DDP see the same batches. Namespace
/// `distributed` as PyTorch's torch.utils.data.distributed; it needs no process group, so it
/// lives with the data.

#include <cstdint>
#include <vector>

#include <torch/arg.h>

namespace lockstep {
namespace distributed {

struct SamplerOptions {
  SamplerOptions(int num_replicas, int rank) : num_replicas_(num_replicas), rank_(rank) {}
  /// Number of ranks sharing the dataset.
  TORCH_ARG(int, num_replicas);
  /// This rank, 0 <= rank < num_replicas.
  TORCH_ARG(int, rank);
  /// Shuffle with a permutation seeded by seed + epoch. Default: true.
  TORCH_ARG(bool, shuffle) = true;
  /// Base seed, the same on every rank. Default: 0 (as PyTorch).
  TORCH_ARG(int64_t, seed) = 0;
  /// Drop the tail so every rank gets size/num_replicas indices, instead of padding with
  /// repeated indices. Default: false.
  TORCH_ARG(bool, drop_last) = false;
  /// Every index once and none twice: no padding, so the first size % num_replicas ranks get one
  /// index more than the others (Lightning's UnrepeatedDistributedSampler, which its predict
  /// uses). Not with drop_last. Default: false (padded, as PyTorch).
  TORCH_ARG(bool, unrepeated) = false;
};

///   DistributedSampler sampler(60000, SamplerOptions(2, rank).seed(42));
///   sampler.set_epoch(epoch);            // a new permutation every epoch
///   for (int64_t i : sampler.indices()) ...
/// Rank r takes every num_replicas-th index of the epoch's order from position r, so with 250
/// examples on 3 ranks the padded split gives each rank 84 (ranks 1 and 2 end on a repeat of
/// the order's first two) and the unrepeated one 84, 83 and 83.
class DistributedSampler {
 public:
  DistributedSampler(int64_t dataset_size, SamplerOptions options);
  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }
  /// This rank's indices for the current epoch: num_samples() of them, the same number on every
  /// rank unless unrepeated.
  std::vector<int64_t> indices() const;
  /// Number of indices of this rank.
  int64_t num_samples() const { return num_samples_; }
  /// How many of this rank's indices, at the end of indices(), repeat an index of the epoch so
  /// that every rank gets as many (0 or 1; 0 with drop_last, unrepeated or an even split).
  int64_t padding() const { return padding_; }
  /// The indices of all ranks together, repeats included (num_samples() * num_replicas unless
  /// unrepeated).
  int64_t total_size() const;
  const SamplerOptions& options() const { return options_; }

 private:
  int64_t dataset_size_;
  SamplerOptions options_;
  int64_t num_samples_;
  int64_t padding_ = 0;
  int64_t epoch_ = 0;
};

}  // namespace distributed
}  // namespace lockstep
