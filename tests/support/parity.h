#pragma once
// Parity helpers for the DDP tests: the same model trained by K ranks (threads) and by one
// process on the whole batch, and comparisons that report the largest difference, its index and
// both values.

#include <cmath>
#include <functional>
#include <iomanip>
#include <algorithm>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

namespace lockstep {
namespace testing {

/// The largest parameter difference seen in a parity run, over all rank threads.
struct Worst {
  std::mutex mutex;
  double value = 0;
  void update(double v) {
    std::lock_guard<std::mutex> lock(mutex);
    value = std::max(value, v);
  }
};

/// The largest absolute difference between two tensors of one shape, and where it is.
struct Difference {
  double max_abs = 0;
  int64_t index = -1;  // flat index
  double actual = 0;
  double expected = 0;
};

inline Difference max_difference(const at::Tensor& actual, const at::Tensor& expected) {
  Difference d;
  auto a = actual.detach().to(torch::kDouble).reshape({-1});
  auto e = expected.detach().to(torch::kDouble).reshape({-1});
  if (a.numel() == 0) return d;
  auto diff = (a - e).abs();
  d.index = diff.argmax().item<int64_t>();
  d.max_abs = diff[d.index].item<double>();
  d.actual = a[d.index].item<double>();
  d.expected = e[d.index].item<double>();
  if (std::isnan(d.actual) != std::isnan(d.expected)) d.max_abs = INFINITY;
  return d;
}

/// Compares parameter lists; on failure names the parameter, the index and both values.
/// `worst` (if given) receives the largest difference seen.
inline ::testing::AssertionResult parameters_close(const std::vector<at::Tensor>& actual,
                                                   const std::vector<at::Tensor>& expected, double tolerance,
                                                   const std::vector<std::string>& names, double* worst = nullptr) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure() << actual.size() << " parameters, expected " << expected.size();
  }
  double largest = 0;
  std::ostringstream failures;
  bool ok = true;
  for (size_t k = 0; k < actual.size(); ++k) {
    if (actual[k].sizes() != expected[k].sizes()) {
      return ::testing::AssertionFailure() << names[k] << ": shape " << actual[k].sizes() << ", expected "
                                           << expected[k].sizes();
    }
    const auto d = max_difference(actual[k], expected[k]);
    largest = std::max(largest, d.max_abs);
    if (!(d.max_abs <= tolerance)) {
      ok = false;
      failures << "\n  " << names[k] << "[" << d.index << "]: " << std::setprecision(10) << d.actual << " vs expected "
               << d.expected << " (|diff| " << d.max_abs << " > " << tolerance << ")";
    }
  }
  if (worst) *worst = largest;
  if (ok) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "parameters differ:" << failures.str();
}

/// A small MLP (8 -> hidden -> hidden -> 4) for parity tests.
struct ParityMlpImpl : torch::nn::Module {
  explicit ParityMlpImpl(int64_t hidden = 16)
      : fc1(register_module("fc1", torch::nn::Linear(8, hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, hidden))),
        fc3(register_module("fc3", torch::nn::Linear(hidden, 4))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return fc3(torch::relu(fc2(torch::relu(fc1(x)))));
  }
  torch::nn::Linear fc1, fc2, fc3;
};
TORCH_MODULE(ParityMlp);

enum class OptimizerKind { sgd, adam };

inline std::unique_ptr<torch::optim::Optimizer> make_optimizer(OptimizerKind kind, std::vector<at::Tensor> params) {
  if (kind == OptimizerKind::sgd) {
    return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.1).momentum(0.9));
  }
  return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(0.01));
}

inline std::vector<at::Tensor> clone_all(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> out;
  for (const auto& t : tensors) out.push_back(t.detach().clone());
  return out;
}

inline void copy_into(const std::vector<at::Tensor>& targets, const std::vector<at::Tensor>& values) {
  torch::NoGradGuard no_grad;
  for (size_t k = 0; k < targets.size(); ++k) targets[k].copy_(values[k]);
}

inline std::vector<std::string> parameter_names(const torch::nn::Module& module) {
  std::vector<std::string> names;
  for (const auto& item : module.named_parameters()) names.push_back(item.key());
  return names;
}

/// Data for `steps` steps of a global batch of `rows` rows: inputs (rows x 8), targets (rows x 4).
struct ParityData {
  std::vector<at::Tensor> inputs, targets;
  ParityData(int steps, int64_t rows, uint64_t seed = 7) {
    auto gen = at::detail::createCPUGenerator(seed);
    for (int s = 0; s < steps; ++s) {
      inputs.push_back(at::randn({rows, 8}, gen));
      targets.push_back(at::randn({rows, 4}, gen));
    }
  }
  /// Rows [rank * per_rank, (rank + 1) * per_rank) of step s.
  at::Tensor input(int s, int rank, int64_t per_rank) const { return inputs[s].narrow(0, rank * per_rank, per_rank); }
  at::Tensor target(int s, int rank, int64_t per_rank) const { return targets[s].narrow(0, rank * per_rank, per_rank); }
};

}  // namespace testing
}  // namespace lockstep
