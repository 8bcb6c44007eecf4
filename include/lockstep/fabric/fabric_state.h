#pragma once
/// FabricState: what Fabric::save writes and Fabric::load restores, by name (Lightning Fabric's
/// `state` dict): modules, saved as their state_dict; optimizers, saved in Python's layout; and
/// plain values (numbers, strings, tensors, lists and dicts of them).

#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include <ATen/core/ivalue.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/optimizer.h>

#include <lockstep/fabric/fabric_module.h>

namespace lockstep {

/// One entry of a FabricState.
class StateEntry {
 public:
  template <typename ModuleType>
  StateEntry(const FabricModule<ModuleType>& module) : module_(module.module()) {}
  template <typename ModuleType, std::enable_if_t<std::is_base_of<torch::nn::Module, ModuleType>::value, int> = 0>
  StateEntry(const std::shared_ptr<ModuleType>& module) : module_(module) {}
  template <typename ModuleType>
  StateEntry(const torch::nn::ModuleHolder<ModuleType>& module) : module_(module.ptr()) {}
  StateEntry(const FabricOptimizer& optimizer) : optimizer_(optimizer.optimizer()) {}
  template <typename OptimizerType,
            std::enable_if_t<std::is_base_of<torch::optim::Optimizer, OptimizerType>::value, int> = 0>
  StateEntry(const std::shared_ptr<OptimizerType>& optimizer) : optimizer_(optimizer) {}
  /// A value: anything a c10::IValue holds (int64_t, double, bool, std::string, a tensor, ...).
  template <typename T, std::enable_if_t<std::is_constructible<c10::IValue, T&&>::value, int> = 0>
  StateEntry(T&& value) : value_(std::forward<T>(value)) {}

  /// Null unless the entry is a module.
  const std::shared_ptr<torch::nn::Module>& module() const { return module_; }
  /// Null unless the entry is an optimizer.
  const std::shared_ptr<torch::optim::Optimizer>& optimizer() const { return optimizer_; }
  /// The value (after Fabric::load, the loaded one); None for a module or an optimizer.
  const c10::IValue& value() const { return value_; }
  void set_value(c10::IValue value) { value_ = std::move(value); }

 private:
  std::shared_ptr<torch::nn::Module> module_;
  std::shared_ptr<torch::optim::Optimizer> optimizer_;
  c10::IValue value_;
};

///   FabricState state{{"state_dict", model}, {"optimizer", optimizer}, {"step", int64_t{10}}};
using FabricState = std::map<std::string, StateEntry>;

}  // namespace lockstep
