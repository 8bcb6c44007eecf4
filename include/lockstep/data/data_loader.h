#pragma once
/// DataLoader: batches of a Dataset in the order a sampler gives, with an optional background
/// thread that prepares the next batch while the current one trains.

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include <torch/arg.h>

#include <lockstep/data/batch_iterator.h>
#include <lockstep/data/dataset.h>
#include <lockstep/data/sampler.h>

namespace lockstep {

struct DataLoaderOptions {
  explicit DataLoaderOptions(int64_t batch_size) : batch_size_(batch_size) {}
  /// Examples per batch on this process.
  TORCH_ARG(int64_t, batch_size);
  /// Shuffle each epoch (seeded by seed() + epoch). Default: false.
  TORCH_ARG(bool, shuffle) = false;
  /// Drop the last incomplete batch. Default: false.
  TORCH_ARG(bool, drop_last) = false;
  /// Seed of the shuffle, and of the DistributedSampler the Trainer and Fabric put on it. Default:
  /// unset (the global seed of `--seed` or seed_everything, as Lightning's PL_GLOBAL_SEED; 0
  /// without one).
  TORCH_ARG(std::optional<int64_t>, seed) = std::nullopt;
  /// Prepare the next batch on a background thread. Default: true.
  TORCH_ARG(bool, prefetch) = true;
};

/// Iterates one epoch at a time:
///   DataLoader loader(dataset, DataLoaderOptions(64).shuffle(true));
///   loader.set_epoch(e);
///   for (Batch& batch : loader) ...           // or loader.batch(i) for i < loader.num_batches()
/// With a DistributedSampler set (the Trainer sets one under DDP), each rank reads its share.
class DataLoader {
 public:
  DataLoader(std::shared_ptr<Dataset> dataset, DataLoaderOptions options);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  /// Replaces the index order by `sampler`'s (its shuffle and seed win over the options').
  void set_sampler(std::shared_ptr<distributed::DistributedSampler> sampler);
  bool has_sampler() const { return sampler_ != nullptr; }
  /// The sampler set, or null.
  const std::shared_ptr<distributed::DistributedSampler>& sampler() const { return sampler_; }
  void set_epoch(int64_t epoch);
  /// Examples per batch from the next batch on (the batch-size finder sets the size it found):
  /// num_batches() follows it. At least 1, else a UsageError.
  void set_batch_size(int64_t batch_size);
  int64_t num_batches() const;
  /// Batch `i` of the current epoch (0 <= i < num_batches(), else a UsageError); sequential access
  /// is prefetched.
  Batch batch(int64_t i);
  /// The dataset indices of batch `i`, in the batch's order.
  std::vector<int64_t> batch_indices(int64_t i) const;
  /// How many examples at the end of batch `i` are the sampler's padding: repeats of examples
  /// that other batches hold (DistributedSampler::padding()); 0 without a sampler.
  int64_t padding_in_batch(int64_t i) const;
  /// Range-for over the current epoch's batches: `for (Batch& batch : loader)`.
  BatchIterator<DataLoader> begin() { return {*this, 0}; }
  BatchIterator<DataLoader> end() { return {*this, num_batches()}; }
  const DataLoaderOptions& options() const { return options_; }
  /// The shuffle's seed: the options' own, else the global seed (global_seed()), else 0.
  int64_t seed() const;
  const std::shared_ptr<Dataset>& dataset() const { return dataset_; }

 private:
  std::vector<int64_t> epoch_indices() const;
  void check_index(const char* what, int64_t i) const;
  Batch load(int64_t i) const;

  std::shared_ptr<Dataset> dataset_;
  DataLoaderOptions options_;
  std::shared_ptr<distributed::DistributedSampler> sampler_;
  int64_t epoch_ = 0;
  std::vector<int64_t> order_;
  struct Prefetch;
  std::unique_ptr<Prefetch> prefetch_;
};

}  // namespace lockstep
