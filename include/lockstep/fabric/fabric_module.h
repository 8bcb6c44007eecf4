#pragma once
/// What Fabric::setup and Fabric::setup_dataloaders return (Lightning Fabric's _FabricModule,
/// _FabricOptimizer and _FabricDataLoader): the user's module, optimizer and loader, run the way
/// the chosen strategy and precision need.

#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <lockstep/core/batch.h>
#include <lockstep/data/data_loader.h>
#include <lockstep/strategies/strategy.h>
#include <lockstep/trainer/grad_scaler.h>
#include <lockstep/trainer/precision.h>

namespace lockstep {

class Fabric;

/// The module, wrapped by the strategy (DDP reduces its gradients in Fabric::backward) and on
/// the device. Calling it runs the module's own forward under the precision's autocast:
///   auto [model, optimizer] = fabric.setup(net, sgd);
///   auto loss = torch::nn::functional::cross_entropy(model(batch.data), batch.target);
/// The Fabric that made it must outlive it.
template <typename ModuleType>
class FabricModule {
 public:
  FabricModule(std::shared_ptr<ModuleType> module, strategies::Strategy& strategy, const Precision& precision)
      : module_(std::move(module)), strategy_(&strategy), precision_(&precision) {}

  template <typename... Args>
  auto forward(Args&&... args) -> decltype(std::declval<ModuleType&>().forward(std::forward<Args>(args)...)) {
    strategy_->prepare_forward();
    Precision::StepScope autocast(*precision_);
    return module_->forward(std::forward<Args>(args)...);
  }
  template <typename... Args>
  auto operator()(Args&&... args) -> decltype(std::declval<ModuleType&>().forward(std::forward<Args>(args)...)) {
    return forward(std::forward<Args>(args)...);
  }

  /// The user's module (its parameters are the ones trained).
  const std::shared_ptr<ModuleType>& module() const { return module_; }
  ModuleType* operator->() const { return module_.get(); }
  std::vector<torch::Tensor> parameters() const { return module_->parameters(); }
  /// The strategy that wraps it.
  strategies::Strategy& strategy() const { return *strategy_; }

 private:
  std::shared_ptr<ModuleType> module_;
  strategies::Strategy* strategy_;
  const Precision* precision_;
};

/// The optimizer, stepping as the precision needs: under 16-mixed, step() unscales the
/// gradients first and skips a step whose gradients hold an inf or a NaN (GradScaler).
class FabricOptimizer {
 public:
  /// `scaler` is null unless the precision scales the loss; it must outlive this object.
  FabricOptimizer(std::shared_ptr<torch::optim::Optimizer> optimizer, GradScaler* scaler)
      : optimizer_(std::move(optimizer)), scaler_(scaler) {}

  /// The optimizer's step; false when 16-mixed skipped it.
  bool step();
  void zero_grad() { optimizer_->zero_grad(); }
  /// The parameters of every parameter group.
  std::vector<torch::Tensor> parameters() const;
  const std::shared_ptr<torch::optim::Optimizer>& optimizer() const { return optimizer_; }
  torch::optim::Optimizer* operator->() const { return optimizer_.get(); }

 private:
  friend class Fabric;
  /// 16-mixed: unscales the gradients once per step; true when they are finite.
  bool unscale();

  std::shared_ptr<torch::optim::Optimizer> optimizer_;
  GradScaler* scaler_;
  std::optional<bool> finite_;  // set once this step's gradients are unscaled
};

/// The loader, with a DistributedSampler under DDP; its batches come on the device, in the
/// precision's dtype (float64 for 64-true).
class FabricDataLoader {
 public:
  FabricDataLoader(std::shared_ptr<DataLoader> loader, torch::Device device, const Precision& precision)
      : loader_(std::move(loader)), device_(device), precision_(&precision) {}

  int64_t num_batches() const { return loader_->num_batches(); }
  /// Batch `i` of this rank's share of the epoch.
  Batch batch(int64_t i);
  /// Reshuffles (with the loader's seed and `epoch`) as the sampler of every rank does.
  void set_epoch(int64_t epoch) { loader_->set_epoch(epoch); }
  const std::shared_ptr<DataLoader>& loader() const { return loader_; }

 private:
  std::shared_ptr<DataLoader> loader_;
  torch::Device device_;
  const Precision* precision_;
};

}  // namespace lockstep
