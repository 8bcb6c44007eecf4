#pragma once
/// Options of Trainer::predict.

#include <torch/arg.h>

namespace lockstep {

///   auto outputs = trainer.predict(model, loader, PredictOptions().gather(true));
struct PredictOptions {
  /// Every rank returns the outputs of all ranks in the dataset's order, batched as the loader
  /// batches: with an unshuffled loader, what one process returns. Each output must then have
  /// one row per example of its batch. A collective. Default: false (each rank returns the
  /// outputs of its own batches).
  TORCH_ARG(bool, gather) = false;
};

}  // namespace lockstep
