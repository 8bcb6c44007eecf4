// The LR finder's results: Lightning's suggestion (the steepest descent of the smoothed loss) and
// the CSV that `lockstep plot` draws.
#include <cmath>
#include <cstdio>
#include <fstream>

#include <torch/torch.h>

#include <lockstep/core/error.h>
#include <lockstep/trainer/tuner.h>

namespace lockstep {

std::optional<size_t> LRFinder::suggestion_index(int64_t skip_begin, int64_t skip_end) const {
  const auto n = static_cast<int64_t>(losses.size());
  LOCKSTEP_CHECK(skip_begin >= 0 && skip_end >= 0, UsageError, "LRFinder::suggestion(", skip_begin, ", ", skip_end,
                 "): the points to skip are counts, 0 or more (Lightning's defaults: 10 and 1).");
  std::vector<float> kept_losses, kept_lrs;
  std::vector<size_t> kept_index;
  for (int64_t i = skip_begin; i < n - skip_end; ++i) {
    // As Lightning: float32 tensors of the Python floats, the non-finite losses left out.
    const auto loss = static_cast<float>(losses[static_cast<size_t>(i)]);
    if (!std::isfinite(loss)) continue;
    kept_losses.push_back(loss);
    const double lr = lrs[static_cast<size_t>(i)];
    kept_lrs.push_back(static_cast<float>(mode == "linear" ? lr : std::log10(lr)));
    kept_index.push_back(static_cast<size_t>(i));
  }
  if (kept_losses.size() < 2) return std::nullopt;  // torch.gradient needs two points
  const auto count = static_cast<int64_t>(kept_losses.size());
  const auto loss = torch::from_blob(kept_losses.data(), {count}, torch::kFloat32);
  const auto lr = torch::from_blob(kept_lrs.data(), {count}, torch::kFloat32);
  // The coordinates of the points: lr, or log10(lr) (see the header).
  const auto gradient = at::gradient(loss, at::TensorList{lr})[0];
  return kept_index[static_cast<size_t>(gradient.argmin().item<int64_t>())];
}

std::optional<double> LRFinder::suggestion(int64_t skip_begin, int64_t skip_end) const {
  const auto index = suggestion_index(skip_begin, skip_end);
  if (!index) return std::nullopt;
  return lrs[*index];
}

void LRFinder::write_csv(const std::string& path) const {
  const auto best = suggestion_index();
  std::ofstream out(path);
  LOCKSTEP_CHECK(out, UsageError, "the LR finder cannot write its results to ", path, "; give a path in a folder ",
                 "that exists and is writable.");
  out << "step,lr,loss,suggested\n";
  char row[128];
  for (size_t i = 0; i < lrs.size() && i < losses.size(); ++i) {
    // 17 digits: the values read back are the ones measured.
    std::snprintf(row, sizeof(row), "%zu,%.17g,%.17g,%d\n", i, lrs[i], losses[i], best && *best == i ? 1 : 0);
    out << row;
  }
}

}  // namespace lockstep
