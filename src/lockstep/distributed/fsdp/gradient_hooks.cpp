#include "gradient_hooks.h"

#include <algorithm>
#include <memory>

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>

namespace lockstep {
namespace distributed {
namespace detail {
namespace {

// Runs before a parameter's gradient is accumulated.
class BeforeAccumulation : public torch::autograd::FunctionPreHook {
 public:
  explicit BeforeAccumulation(std::function<void()> run) : run_(std::move(run)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    run_();
    return grads;
  }

 private:
  std::function<void()> run_;
};

}  // namespace

GradientHooks::~GradientHooks() {
  for (size_t k = 0; k < accumulators_.size(); ++k) {
    accumulators_[k]->del_post_hook(post_hook_keys_[k]);
    auto& pre = accumulators_[k]->pre_hooks();
    pre.erase(std::remove_if(pre.begin(), pre.end(), [&](const auto& hook) { return hook.get() == pre_hooks_[k]; }),
              pre.end());
  }
}

void GradientHooks::add(const at::Tensor& parameter, std::function<void()> before, std::function<void()> after) {
  auto accumulator = torch::autograd::impl::grad_accumulator(parameter);
  post_hook_keys_.push_back(accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
      [after = std::move(after)](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
        after();
        return outputs;
      })));
  auto hook = std::make_unique<BeforeAccumulation>(std::move(before));
  pre_hooks_.push_back(hook.get());
  accumulator->add_pre_hook(std::move(hook));
  accumulators_.push_back(std::move(accumulator));
}

void GradientHooks::reattach(size_t k, const at::Tensor& parameter) const {
  libtorch::restore_grad_accumulator(parameter, accumulators_.at(k));
}

}  // namespace detail
}  // namespace distributed
}  // namespace lockstep
