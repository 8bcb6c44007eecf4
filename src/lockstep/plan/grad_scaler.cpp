#include <lockstep/plan/grad_scaler.h>

#include <string>

#include <torch/torch.h>

#include <lockstep/core/error.h>

namespace lockstep {

GradScaler::GradScaler(GradScalerOptions options) : options_(options), scale_(options.init_scale()) {
  LOCKSTEP_CHECK(options_.init_scale() > 0, UsageError, "GradScaler init_scale is ", options_.init_scale(),
                 ": use a positive scale (PyTorch's default is 65536).");
  LOCKSTEP_CHECK(options_.growth_factor() > 1, UsageError, "GradScaler growth_factor is ", options_.growth_factor(),
                 ": use a factor above 1 (default 2).");
  LOCKSTEP_CHECK(options_.backoff_factor() > 0 && options_.backoff_factor() < 1, UsageError,
                 "GradScaler backoff_factor is ", options_.backoff_factor(), ": use a factor in (0, 1) (default 0.5).");
  LOCKSTEP_CHECK(options_.growth_interval() >= 1, UsageError, "GradScaler growth_interval is ",
                 options_.growth_interval(), ": use 1 or more steps (default 2000).");
}

torch::Tensor GradScaler::scale(const torch::Tensor& loss) const { return loss * scale_; }

void GradScaler::backward(const torch::Tensor& loss, const std::function<void(const torch::Tensor&)>& run) {
  struct Running {
    explicit Running(std::atomic<int>& count) : count_(count) { ++count_; }
    ~Running() { --count_; }
    std::atomic<int>& count_;
  } running(watch_->scaled_backwards);
  const auto scaled = scale(loss);
  if (run) {
    run(scaled);
  } else {
    scaled.backward();
  }
}

void GradScaler::watch(const std::vector<torch::Tensor>& parameters) {
  for (const auto& p : parameters) {
    if (!p.requires_grad()) continue;
    auto watch = watch_;
    // Backward may run on autograd's device threads: the flags are atomic.
    p.register_hook([watch](const torch::Tensor&) {
      if (watch->scaled_backwards.load() == 0) watch->unscaled_gradient = true;
    });
  }
}

bool GradScaler::unscale(const std::vector<torch::Tensor>& parameters) const {
  LOCKSTEP_CHECK(!watch_->unscaled_gradient.load(), UsageError,
                 "16-mixed: a gradient came from a backward that skipped the loss scaling (loss.backward() "
                 "instead of fabric.backward(loss)), so unscaling it before the optimizer step would shrink it ",
                 scale_, " times. Call fabric.backward(loss) for every backward under 16-mixed.");
  torch::NoGradGuard no_grad;
  const double inverse = 1.0 / scale_;
  torch::Tensor found;  // one flag on the gradients' device: a single host sync at the end
  for (const auto& p : parameters) {
    auto grad = p.grad();
    if (!grad.defined()) continue;
    grad.mul_(inverse);
    auto bad = grad.isfinite().logical_not().any();
    found = found.defined() ? found.logical_or(bad.to(found.device())) : bad;
  }
  return !found.defined() || !found.item<bool>();
}

void GradScaler::update(bool found_inf) {
  if (found_inf) {
    scale_ *= options_.backoff_factor();
    growth_tracker_ = 0;
  } else if (++growth_tracker_ == options_.growth_interval()) {
    scale_ *= options_.growth_factor();
    growth_tracker_ = 0;
  }
}

c10::impl::GenericDict GradScaler::state_dict() const {
  c10::impl::GenericDict state(c10::StringType::get(), c10::AnyType::get());
  state.insert("scale", scale_);
  state.insert("growth_factor", options_.growth_factor());
  state.insert("backoff_factor", options_.backoff_factor());
  state.insert("growth_interval", options_.growth_interval());
  state.insert("_growth_tracker", growth_tracker_);
  return state;
}

void GradScaler::load_state_dict(const c10::impl::GenericDict& state) {
  for (const char* key : {"scale", "_growth_tracker"}) {
    LOCKSTEP_CHECK(state.contains(key), UsageError, "the loss scaler's state has no \"", key,
                   "\": pass a checkpoint that a 16-mixed run wrote, or start this run without --ckpt-path.");
  }
  const auto scale = state.at("scale"), tracker = state.at("_growth_tracker");
  LOCKSTEP_CHECK(scale.isDouble() && scale.toDouble() > 0, UsageError,
                 "the loss scaler's \"scale\" should be a positive float; it is ", scale.tagKind(), ".");
  LOCKSTEP_CHECK(tracker.isInt() && tracker.toInt() >= 0, UsageError,
                 "the loss scaler's \"_growth_tracker\" should be a count; it is ", tracker.tagKind(), ".");
  scale_ = scale.toDouble();
  growth_tracker_ = tracker.toInt();
}

}  // namespace lockstep
