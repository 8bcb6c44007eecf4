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
#include <lockstep/distributed/ddp/output_tensors.h>
#include <lockstep/plan/grad_scaler.h>
#include <lockstep/plan/precision.h>
#include <lockstep/strategies/strategy.h>
#include <lockstep/strategies/wrapped_module.h>

namespace lockstep {

/// The module, wrapped by the strategy and on the device. Calling it runs the module's own
/// forward under the precision's autocast; under DDP that forward arms the reduction, so the
/// next backward (fabric.backward(loss), or a plain loss.backward()) averages the gradients:
///   auto [model, optimizer] = fabric.setup(net, sgd);
///   auto loss = torch::nn::functional::cross_entropy(model(batch.data), batch.target);
/// `model->` reaches the module's members; a forward called that way (model->forward(x))
/// bypasses the wrapper, and under DDP its backward is refused. The Fabric that made it must
/// outlive it.
template <typename ModuleType>
class FabricModule {
 public:
  FabricModule(std::shared_ptr<ModuleType> module, std::shared_ptr<strategies::WrappedModule> wrapped,
               strategies::Strategy& strategy, const Precision& precision)
      : module_(std::move(module)), wrapped_(std::move(wrapped)), strategy_(&strategy), precision_(&precision) {}

  template <typename... Args>
  auto forward(Args&&... args) -> decltype(std::declval<ModuleType&>().forward(std::forward<Args>(args)...)) {
    wrapped_->before_forward();
    auto outputs = run_forward(std::forward<Args>(args)...);
    std::vector<at::Tensor> tensors;
    const bool known = distributed::output_tensors(outputs, tensors);
    wrapped_->after_forward(tensors, known);
    return outputs;
  }
  template <typename... Args>
  auto operator()(Args&&... args) -> decltype(std::declval<ModuleType&>().forward(std::forward<Args>(args)...)) {
    return forward(std::forward<Args>(args)...);
  }

  /// The user's module (its parameters are the ones trained).
  const std::shared_ptr<ModuleType>& module() const { return module_; }
  ModuleType* operator->() const { return module_.get(); }
  std::vector<torch::Tensor> parameters() const { return module_->parameters(); }
  /// How the strategy runs it (gradient sync on or off).
  strategies::WrappedModule& wrapped() const { return *wrapped_; }
  /// The strategy that wraps it.
  strategies::Strategy& strategy() const { return *strategy_; }

 private:
  template <typename... Args>
  auto run_forward(Args&&... args) {
    Precision::StepScope autocast(*precision_);
    return module_->forward(std::forward<Args>(args)...);
  }

  std::shared_ptr<ModuleType> module_;
  std::shared_ptr<strategies::WrappedModule> wrapped_;
  strategies::Strategy* strategy_;
  const Precision* precision_;
};

/// The optimizer, stepping as the precision needs: under 16-mixed, step() unscales the
/// gradients first and skips a step whose gradients hold an inf or a NaN (GradScaler).
/// `optimizer->step()` is the same call as `optimizer.step()`, so a loop written for the plain
/// optimizer keeps working; optimizer() is the optimizer itself.
class FabricOptimizer {
 public:
  /// `scaler` is null unless the precision scales the loss; it must outlive this object.
  FabricOptimizer(std::shared_ptr<torch::optim::Optimizer> optimizer, GradScaler* scaler)
      : optimizer_(std::move(optimizer)), scaler_(scaler) {}

  /// The optimizer's step; false when 16-mixed skipped it. Under 16-mixed, a UsageError when a
  /// gradient came from a backward that was not scaled (loss.backward() for fabric.backward).
  bool step();
  void zero_grad() { optimizer_->zero_grad(); }
  std::vector<torch::optim::OptimizerParamGroup>& param_groups() { return optimizer_->param_groups(); }
  /// The parameters of every parameter group.
  std::vector<torch::Tensor> parameters() const;
  const std::shared_ptr<torch::optim::Optimizer>& optimizer() const { return optimizer_; }
  /// This object: `optimizer->step()` steps through the precision as step() does.
  FabricOptimizer* operator->() { return this; }

 private:
  friend class Fabric;
  /// 16-mixed: unscales the gradients once per step; true when they are finite.
  bool unscale();

  std::shared_ptr<torch::optim::Optimizer> optimizer_;
  GradScaler* scaler_;
  std::optional<bool> finite_;  // set once this step's gradients are unscaled
};

/// The loader, with a DistributedSampler under DDP; its batches come on the device (unless
/// made without moving), in the precision's dtype (float64 for 64-true). `loader->batch(i)` is
/// the same call as `loader.batch(i)`.
class FabricDataLoader {
 public:
  FabricDataLoader(std::shared_ptr<DataLoader> loader, torch::Device device, const Precision& precision,
                   bool move_to_device = true)
      : loader_(std::move(loader)), device_(device), precision_(&precision), move_to_device_(move_to_device) {}

  int64_t num_batches() const { return loader_->num_batches(); }
  /// Batch `i` of this rank's share of the epoch.
  Batch batch(int64_t i);
  /// Reshuffles (with the loader's seed and `epoch`) as the sampler of every rank does.
  void set_epoch(int64_t epoch) { loader_->set_epoch(epoch); }
  const std::shared_ptr<DataLoader>& loader() const { return loader_; }
  /// This object, so that a loop written for the plain loader (`loader->batch(i)`) reads this one.
  FabricDataLoader* operator->() { return this; }
  /// This object, so that `for (Batch& batch : *loader)` over the plain loader reads this one.
  FabricDataLoader& operator*() { return *this; }
  /// Range-for over this rank's batches of the epoch, on the device: `for (Batch& batch : loader)`.
  BatchIterator<FabricDataLoader> begin() { return {*this, 0}; }
  BatchIterator<FabricDataLoader> end() { return {*this, num_batches()}; }

 private:
  std::shared_ptr<DataLoader> loader_;
  torch::Device device_;
  const Precision* precision_;
  bool move_to_device_;
};

}  // namespace lockstep
