// The Trainer's predict loop: Lightning's unrepeated split of the loader over the ranks, and the
// outputs of every rank gathered in the dataset's order (PredictOptions::gather).
#include <algorithm>

#include <torch/torch.h>

#include <lockstep/trainer/trainer.h>

#include "trainer_internal.h"

namespace lockstep {
namespace {

// `rows` padded with `fill` to `length` rows, so that every rank's piece has one shape.
torch::Tensor padded_to(const torch::Tensor& rows, int64_t length, double fill) {
  if (rows.size(0) == length) return rows;
  auto shape = rows.sizes().vec();
  shape[0] = length - rows.size(0);
  return torch::cat({rows, torch::full(shape, fill, rows.options())});
}

// Every rank's rows and their dataset indices, in rank order (a collective: ranks may hold
// different numbers of rows).
std::pair<torch::Tensor, torch::Tensor> all_ranks_rows(strategies::Strategy& strategy, const torch::Tensor& rows,
                                                       const torch::Tensor& index) {
  if (strategy.world_size() == 1) return {rows, index};
  const auto counts = strategy.all_gather(torch::full({1}, rows.size(0), index.options()));
  int64_t longest = 0;
  for (const auto& count : counts) longest = std::max(longest, count.item<int64_t>());
  const auto all_rows = strategy.all_gather(padded_to(rows, longest, 0));
  const auto all_index = strategy.all_gather(padded_to(index, longest, -1));
  std::vector<torch::Tensor> rows_of, index_of;
  for (size_t r = 0; r < counts.size(); ++r) {
    const int64_t n = counts[r].item<int64_t>();
    rows_of.push_back(all_rows[r].narrow(0, 0, n));
    index_of.push_back(all_index[r].narrow(0, 0, n));
  }
  return {torch::cat(rows_of), torch::cat(index_of)};
}

// All ranks' outputs, one row per index, in the order of the dataset and in batches of
// `batch_size`; an index that two ranks predicted (a padded sampler of the user's) once.
std::vector<torch::Tensor> in_dataset_order(strategies::Strategy& strategy, const std::vector<torch::Tensor>& outputs,
                                            const std::vector<int64_t>& indices, int64_t batch_size) {
  const auto mine = torch::cat(outputs);
  const auto device = strategy.root_device();
  const auto index = torch::tensor(indices, torch::kInt64).to(device);
  auto [rows, all_index] = all_ranks_rows(strategy, mine.to(device), index);
  const auto sorted = all_index.sort(/*stable=*/true, 0, false);
  const auto& order_index = std::get<0>(sorted);
  auto keep = torch::ones({order_index.size(0)}, torch::dtype(torch::kBool).device(device));
  if (order_index.size(0) > 1) keep.narrow(0, 1, order_index.size(0) - 1).copy_(order_index.diff() != 0);
  const auto order = std::get<1>(sorted).masked_select(keep);
  auto split = rows.index_select(0, order).to(mine.device()).split(batch_size);
  return std::vector<torch::Tensor>(split.begin(), split.end());
}

}  // namespace

std::vector<torch::Tensor> Trainer::predict(const std::shared_ptr<TrainingModule>& module,
                                            const std::shared_ptr<DataLoader>& loader, PredictOptions options) {
  if (!loader) throw UsageError("Trainer::predict needs a DataLoader; it was null.");
  setup(module);
  // Ranks may then run different numbers of steps, which steps that meet (FSDP's) cannot.
  const bool unrepeated = !plan_.strategy->evaluation_steps_meet();
  if (options_.use_distributed_sampler()) {
    strategies::add_distributed_sampler(*plan_.strategy, *loader, false, unrepeated);
  }
  EvaluationGuard evaluating(options_.inference_mode());
  module_->eval();
  std::vector<torch::Tensor> outputs;
  std::vector<int64_t> indices;
  const auto device = plan_.strategy->root_device();
  const int64_t batches = options_.fast_dev_run() > 0 ? std::min(options_.fast_dev_run(), loader->num_batches())
                                                      : loader->num_batches();
  for (int64_t i = 0; i < batches; ++i) {
    auto [batch, counted] = detail::evaluation_batch(*loader, i);
    module_->transfer_batch_to_device(batch, device);
    plan_.precision.convert_batch(batch);
    Batch& input = batch;
    auto output = run_step([&] {
      plan_.strategy->before_evaluation_step();
      return module_->predict_step(input, i);
    });
    if (options.gather()) {
      LOCKSTEP_CHECK(output.defined() && output.dim() > 0 && output.size(0) == input.size(), UsageError,
                     "Trainer::predict with PredictOptions().gather(true): predict_step returned ",
                     output.defined() ? output.sizes() : c10::IntArrayRef{}, " for batch ", i, " of ", input.size(),
                     " examples; gathering places one row per example in the dataset's order, so return a tensor ",
                     "whose first dimension is the batch's, or predict without gather.");
      output = output.narrow(0, 0, counted);
      auto mine = loader->batch_indices(i);
      indices.insert(indices.end(), mine.begin(), mine.begin() + counted);
    } else if (counted == 0) {
      continue;  // only repeats of other batches' examples
    }
    outputs.push_back(output);
  }
  module_->train();
  if (!options.gather() || outputs.empty()) return outputs;
  return in_dataset_order(*plan_.strategy, outputs, indices, loader->options().batch_size());
}

}  // namespace lockstep
