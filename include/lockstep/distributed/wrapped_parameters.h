#pragma once
/// WrappedParameters: the parameters a data-parallel wrapper took over when it wrapped a module.
/// A parameter registered (or replaced) on the module after that lies in no bucket or unit: its
/// gradient would never be averaged and the ranks would drift apart in silence. The wrappers
/// (DistributedDataParallel, SeparateDDP, FullyShardedDataParallel) check at every forward.

#include <string>
#include <vector>

#include <torch/nn/module.h>

namespace lockstep {
namespace distributed {

class WrappedParameters {
 public:
  WrappedParameters() = default;
  /// Remembers `module`'s parameters now; `wrapper` names the wrapper in messages.
  WrappedParameters(const torch::nn::Module& module, std::string wrapper);
  /// Throws UsageError naming the first parameter of `module` that was not there when it was
  /// wrapped (or one that is gone), and the fix. A walk over the module's parameters: a few
  /// pointer comparisons each.
  void check(const torch::nn::Module& module) const;

 private:
  std::vector<const void*> tensors_;
  std::vector<std::string> names_;
  std::string wrapper_;
};

}  // namespace distributed
}  // namespace lockstep
