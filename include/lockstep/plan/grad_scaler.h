#pragma once
/// GradScaler: dynamic loss scaling for float16 mixed precision (--precision 16-mixed), as
/// PyTorch's torch.amp.GradScaler, which LibTorch's C++ API lacks. The loss is multiplied by the
/// scale before backward, so that small float16 gradients do not flush to zero; before the
/// optimizer step the gradients are divided by it again. A step whose gradients hold an inf or a
/// NaN is skipped and the scale shrinks by backoff_factor; after growth_interval good steps in a
/// row it grows by growth_factor.
///
///   GradScaler scaler;
///   scaler.scale(loss).backward();
///   const bool finite = scaler.unscale(model->parameters());  // before clipping
///   if (finite) optimizer.step();
///   scaler.update(!finite);

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <torch/arg.h>
#include <torch/types.h>

namespace lockstep {

/// PyTorch's defaults.
struct GradScalerOptions {
  /// The first scale. Default: 65536 (2^16).
  TORCH_ARG(double, init_scale) = 65536.0;
  /// The scale is multiplied by this after growth_interval finite steps in a row. Default: 2.
  TORCH_ARG(double, growth_factor) = 2.0;
  /// The scale is multiplied by this after a step with an inf or NaN gradient. Default: 0.5.
  TORCH_ARG(double, backoff_factor) = 0.5;
  /// Finite steps in a row before the scale grows. Default: 2000.
  TORCH_ARG(int64_t, growth_interval) = 2000;
};

class GradScaler {
 public:
  /// A UsageError for a scale that is not positive, a growth factor not above 1, a backoff factor
  /// outside (0, 1) or an interval below 1.
  explicit GradScaler(GradScalerOptions options = {});

  /// `loss` times the scale.
  torch::Tensor scale(const torch::Tensor& loss) const;
  /// run(scale(loss)), by default its backward(): the gradients that arrive during it are
  /// scaled ones.
  void backward(const torch::Tensor& loss, const std::function<void(const torch::Tensor&)>& run = {});
  /// Watches the gradients of `parameters`: one that arrives outside backward() (a plain
  /// loss.backward() that skipped the scaling) makes the next unscale() a UsageError instead of
  /// a silently mis-scaled step.
  void watch(const std::vector<torch::Tensor>& parameters);
  /// Divides the gradients of `parameters` by the scale, in place; true when all are finite.
  /// Once per optimizer step, after backward and before clipping.
  bool unscale(const std::vector<torch::Tensor>& parameters) const;
  /// After each optimizer step, skipped (found_inf) or not: shrinks or counts toward growth.
  void update(bool found_inf);

  double get_scale() const { return scale_; }
  /// Finite steps since the scale last changed.
  int64_t growth_tracker() const { return growth_tracker_; }

  /// PyTorch's keys: scale, growth_factor, backoff_factor, growth_interval, _growth_tracker.
  c10::impl::GenericDict state_dict() const;
  /// Restores scale and growth tracker; a UsageError naming the key when one is missing or mistyped.
  void load_state_dict(const c10::impl::GenericDict& state);

 private:
  /// Shared with the watched parameters' hooks, which may outlive the scaler.
  struct Watch {
    std::atomic<int> scaled_backwards{0};  // backward() calls running
    std::atomic<bool> unscaled_gradient{false};
  };

  GradScalerOptions options_;
  double scale_;
  int64_t growth_tracker_ = 0;
  std::shared_ptr<Watch> watch_ = std::make_shared<Watch>();
};

}  // namespace lockstep
