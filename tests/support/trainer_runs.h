#pragma once
// Scaffolding for Trainer tests that run fit/validate/test/predict in-process: quiet options
// under a temporary folder, loaders over the regression data, and data whose target marks
// where a batch came from.

#include <memory>
#include <string>

#include <torch/torch.h>

#include <lockstep/data/data_loader.h>
#include <lockstep/trainer/trainer_options.h>

#include "regression.h"
#include "temp_dir.h"

namespace lockstep {
namespace testing {

/// No progress bar, no checkpoints, no sanity validation; logs under `dir`.
inline TrainerOptions quiet_options(const TempDir& dir) {
  return TrainerOptions()
      .enable_progress_bar(false)
      .enable_checkpointing(false)
      .num_sanity_val_steps(0)
      .default_root_dir(dir.path());
}

/// Batches of `batch_size` over `data` in order (no shuffle).
inline std::shared_ptr<DataLoader> loader_of(std::shared_ptr<Dataset> data, int64_t batch_size) {
  return std::make_shared<DataLoader>(std::move(data), DataLoaderOptions(batch_size));
}

/// `n` examples of 8 features whose target is `marker` everywhere: a step can tell which loader
/// its batch came from.
inline std::shared_ptr<TensorDataset> marked_data(int64_t n, double marker) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(n));
  return std::make_shared<TensorDataset>(torch::randn({n, 8}, generator), torch::full({n, 1}, marker));
}

}  // namespace testing
}  // namespace lockstep
