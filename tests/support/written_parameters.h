#pragma once
// What tests/programs/trainer_program leaves behind: each rank's parameters in OUT/params.<rank>.pt,
// and how far apart two such lists (or two state_dicts) are.

#include <algorithm>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace lockstep {
namespace testing {

/// Each rank's parameters, in rank order, as trainer_program wrote them into `out`.
inline std::vector<std::vector<torch::Tensor>> written_parameters(const std::filesystem::path& out) {
  std::vector<std::vector<torch::Tensor>> ranks;
  for (int r = 0; std::filesystem::exists(out / ("params." + std::to_string(r) + ".pt")); ++r) {
    std::vector<torch::Tensor> params;
    torch::load(params, (out / ("params." + std::to_string(r) + ".pt")).string());
    ranks.push_back(params);
  }
  return ranks;
}

/// The largest absolute difference between two parameter lists (a size mismatch or an empty list
/// fails the test).
inline double max_diff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  EXPECT_EQ(a.size(), b.size());
  EXPECT_FALSE(a.empty());
  double worst = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) worst = std::max(worst, (a[i] - b[i]).abs().max().item<double>());
  return worst;
}

/// The same over named tensors (a state_dict): a name missing from `b` fails the test.
inline double max_diff(const std::map<std::string, torch::Tensor>& a, const std::map<std::string, torch::Tensor>& b) {
  EXPECT_EQ(a.size(), b.size());
  EXPECT_FALSE(a.empty());
  double worst = 0;
  for (const auto& [name, tensor] : a) {
    if (!b.count(name)) {
      ADD_FAILURE() << name << " is missing";
      continue;
    }
    worst = std::max(worst, (tensor - b.at(name)).abs().max().item<double>());
  }
  return worst;
}

}  // namespace testing
}  // namespace lockstep
