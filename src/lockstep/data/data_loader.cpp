#include <lockstep/data/data_loader.h>

#include <future>

#include <torch/torch.h>

#include <lockstep/core/error.h>
#include <lockstep/core/seed.h>

namespace lockstep {

// The batch being prepared in the background, and which one it is.
struct DataLoader::Prefetch {
  int64_t index = -1;
  std::future<Batch> batch;
};

DataLoader::DataLoader(std::shared_ptr<Dataset> dataset, DataLoaderOptions options)
    : dataset_(std::move(dataset)), options_(std::move(options)), prefetch_(std::make_unique<Prefetch>()) {
  if (!dataset_) throw UsageError("DataLoader: the dataset is null; pass a std::shared_ptr<Dataset>.");
  if (options_.batch_size() < 1) {
    throw UsageError("DataLoader: batch_size=" + std::to_string(options_.batch_size()) +
                     "; it must be at least 1 (e.g. --batch-size 64).");
  }
  order_ = epoch_indices();
}

DataLoader::~DataLoader() {
  if (prefetch_ && prefetch_->batch.valid()) prefetch_->batch.wait();
}

void DataLoader::set_sampler(std::shared_ptr<distributed::DistributedSampler> sampler) {
  sampler_ = std::move(sampler);
  set_epoch(epoch_);
}

void DataLoader::set_epoch(int64_t epoch) {
  if (prefetch_->batch.valid()) prefetch_->batch.wait();
  prefetch_->index = -1;
  prefetch_->batch = {};
  epoch_ = epoch;
  if (sampler_) sampler_->set_epoch(epoch);
  order_ = epoch_indices();
}

void DataLoader::set_batch_size(int64_t batch_size) {
  LOCKSTEP_CHECK(batch_size >= 1, UsageError, "DataLoader::set_batch_size(", batch_size, "): a batch holds at least 1 ",
                 "example; pass 1 or more.");
  // The batch being prepared was cut at the old size.
  if (prefetch_->batch.valid()) prefetch_->batch.wait();
  prefetch_->index = -1;
  prefetch_->batch = {};
  options_.batch_size(batch_size);
}

int64_t DataLoader::seed() const {
  if (options_.seed()) return *options_.seed();
  return static_cast<int64_t>(global_seed().value_or(0));
}

std::vector<int64_t> DataLoader::epoch_indices() const {
  if (sampler_) return sampler_->indices();
  const int64_t n = dataset_->size();
  if (options_.shuffle()) {
    auto generator = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(seed() + epoch_));
    auto perm = torch::randperm(n, generator, torch::kInt64);
    return std::vector<int64_t>(perm.data_ptr<int64_t>(), perm.data_ptr<int64_t>() + n);
  }
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
  return order;
}

int64_t DataLoader::num_batches() const {
  const auto n = static_cast<int64_t>(order_.size());
  const int64_t b = options_.batch_size();
  return options_.drop_last() ? n / b : (n + b - 1) / b;
}

std::vector<int64_t> DataLoader::batch_indices(int64_t i) const {
  check_index("batch_indices", i);
  const int64_t b = options_.batch_size();
  const auto begin = order_.begin() + i * b;
  const auto end = order_.begin() + std::min<int64_t>(static_cast<int64_t>(order_.size()), (i + 1) * b);
  return std::vector<int64_t>(begin, end);
}

int64_t DataLoader::padding_in_batch(int64_t i) const {
  check_index("padding_in_batch", i);
  if (!sampler_ || sampler_->padding() == 0) return 0;
  // The padding is the end of this rank's order.
  const int64_t b = options_.batch_size(), n = static_cast<int64_t>(order_.size());
  const int64_t first_padded = n - sampler_->padding();
  const int64_t end = std::min(n, (i + 1) * b);
  return std::max<int64_t>(0, end - std::max(i * b, first_padded));
}

void DataLoader::check_index(const char* what, int64_t i) const {
  if (i >= 0 && i < num_batches()) return;
  throw UsageError(std::string("DataLoader::") + what + ": index " + std::to_string(i) + " is outside [0, " +
                   std::to_string(num_batches()) + "), the batches of this epoch; use an index below num_batches().");
}

Batch DataLoader::load(int64_t i) const { return dataset_->get_batch(batch_indices(i)); }

Batch DataLoader::batch(int64_t i) {
  check_index("batch", i);
  Batch result;
  if (prefetch_->index == i && prefetch_->batch.valid()) {
    result = prefetch_->batch.get();
  } else {
    if (prefetch_->batch.valid()) prefetch_->batch.wait();
    result = load(i);
  }
  prefetch_->index = -1;
  if (options_.prefetch() && i + 1 < num_batches()) {
    prefetch_->index = i + 1;
    prefetch_->batch = std::async(std::launch::async, [this, next = i + 1] { return load(next); });
  }
  return result;
}

}  // namespace lockstep
