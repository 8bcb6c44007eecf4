#pragma once
// A small regression problem and model for Trainer and DDP tests: y = x·w + noise, fixed seed.

#include <memory>

#include <torch/torch.h>

#include <lockstep/data/dataset.h>
#include <lockstep/core/training_module.h>

namespace lockstep {
namespace testing {

inline std::shared_ptr<TensorDataset> regression_data(int64_t n, int64_t features = 8, uint64_t seed = 7) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto x = torch::randn({n, features}, generator);
  auto w = torch::arange(features, torch::kFloat32).unsqueeze(1) / features;
  auto y = x.mm(w) + 0.01 * torch::randn({n, 1}, generator);
  return std::make_shared<TensorDataset>(x, y);
}

/// Two linear layers with a ReLU; SGD with momentum or Adam.
struct Regressor : TrainingModule {
  explicit Regressor(bool adam = false, int64_t features = 8) : adam(adam) {
    fc1 = register_module("fc1", torch::nn::Linear(features, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 1));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(fc1(x))); }
  torch::Tensor training_step(Batch& batch, int64_t) override {
    auto loss = torch::mse_loss(forward(batch.data), batch.target);
    log("train_loss", loss, LogOptions().prog_bar(true));
    return loss;
  }
  void validation_step(Batch& batch, int64_t) override {
    log("val_loss", torch::mse_loss(forward(batch.data), batch.target), LogOptions().sync_dist(true));
  }
  OptimizerConfig configure_optimizers() override {
    if (adam) return std::make_shared<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(1e-2));
    return std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  }
  bool adam;
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

inline double max_abs_diff(torch::nn::Module& a, torch::nn::Module& b) {
  auto pa = a.parameters(), pb = b.parameters();
  double worst = 0;
  for (size_t i = 0; i < pa.size(); ++i) worst = std::max(worst, (pa[i] - pb[i]).abs().max().item<double>());
  return worst;
}

}  // namespace testing
}  // namespace lockstep
