#include <lockstep/data/sampler.h>

#include <torch/torch.h>

#include <lockstep/core/error.h>

namespace lockstep {
namespace distributed {

DistributedSampler::DistributedSampler(int64_t dataset_size, SamplerOptions options)
    : dataset_size_(dataset_size), options_(std::move(options)) {
  const int n = options_.num_replicas();
  if (n < 1 || options_.rank() < 0 || options_.rank() >= n) {
    throw UsageError("DistributedSampler: rank " + std::to_string(options_.rank()) + " of num_replicas " +
                     std::to_string(n) + ": need 0 <= rank < num_replicas.");
  }
  LOCKSTEP_CHECK(!(options_.unrepeated() && options_.drop_last()), UsageError, "DistributedSampler: unrepeated and ",
                 "drop_last both set; unrepeated keeps every index once, drop_last drops the tail. Choose one.");
  const int64_t rank = options_.rank();
  if (options_.unrepeated()) {
    num_samples_ = dataset_size_ / n + (rank < dataset_size_ % n ? 1 : 0);
  } else if (options_.drop_last() && dataset_size_ % n != 0) {
    num_samples_ = dataset_size_ / n;
  } else {
    num_samples_ = (dataset_size_ + n - 1) / n;
    // The padded positions are the last of the epoch's order: one each at the end of the
    // ranks that the order's tail does not reach.
    padding_ = rank + (num_samples_ - 1) * n >= dataset_size_ ? 1 : 0;
  }
  // Decided alike on every rank: an unrepeated split leaves only the last ranks without data.
  if (num_samples_ == 0 || (options_.unrepeated() && dataset_size_ < n)) {
    const int64_t empty = options_.unrepeated() ? n - 1 : rank;
    throw UsageError("DistributedSampler: a dataset of " + std::to_string(dataset_size_) + " examples leaves rank " +
                     std::to_string(empty) + " of " + std::to_string(n) +
                     " with nothing; use fewer processes or more data.");
  }
}

int64_t DistributedSampler::total_size() const {
  return options_.unrepeated() ? dataset_size_ : num_samples_ * options_.num_replicas();
}

std::vector<int64_t> DistributedSampler::indices() const {
  std::vector<int64_t> all(static_cast<size_t>(dataset_size_));
  if (options_.shuffle()) {
    // The permutation PyTorch's sampler draws: randperm with a CPU generator seeded seed+epoch.
    auto generator = at::make_generator<at::CPUGeneratorImpl>(
        static_cast<uint64_t>(options_.seed() + epoch_));
    auto perm = torch::randperm(dataset_size_, generator, torch::kInt64);
    std::copy(perm.data_ptr<int64_t>(), perm.data_ptr<int64_t>() + dataset_size_, all.begin());
  } else {
    for (int64_t i = 0; i < dataset_size_; ++i) all[static_cast<size_t>(i)] = i;
  }
  const int64_t n = options_.num_replicas();
  if (options_.unrepeated()) {
    std::vector<int64_t> mine;
    mine.reserve(static_cast<size_t>(num_samples_));
    for (int64_t i = options_.rank(); i < dataset_size_; i += n) mine.push_back(all[static_cast<size_t>(i)]);
    return mine;
  }
  const int64_t total = num_samples_ * n;
  if (static_cast<int64_t>(all.size()) < total) {
    // Pad by repeating from the start (as many times as needed), as PyTorch does.
    const size_t original = all.size();
    for (size_t i = 0; static_cast<int64_t>(all.size()) < total; ++i) all.push_back(all[i % original]);
  }
  all.resize(static_cast<size_t>(total));
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(num_samples_));
  for (int64_t i = options_.rank(); i < total; i += n) mine.push_back(all[static_cast<size_t>(i)]);
  return mine;
}

}  // namespace distributed
}  // namespace lockstep
