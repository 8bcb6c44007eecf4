#pragma once
/// WrappedModule: a module as a strategy runs it (what Lightning Fabric's strategy.setup_module
/// returns). Fabric's modules call it around each forward; DDP arms its gradient reduction there,
/// one process needs nothing.

#include <vector>

#include <ATen/core/Tensor.h>

namespace lockstep {
namespace strategies {

class WrappedModule {
 public:
  virtual ~WrappedModule() = default;
  /// Before each forward through the wrapper (DDP: buffers from rank 0 in training forwards,
  /// buckets rebuilt once).
  virtual void before_forward() {}
  /// After it, with the tensors it returned (`known` false when some could not be found): DDP
  /// arms the reduction of the next backward when grad mode is on.
  virtual void after_forward(const std::vector<at::Tensor>& outputs, bool known) {}
  /// Whether backward passes reduce gradients across ranks (false inside no_backward_sync).
  virtual bool gradient_sync() const { return true; }
  virtual void set_gradient_sync(bool enabled) {}
};

}  // namespace strategies
}  // namespace lockstep
