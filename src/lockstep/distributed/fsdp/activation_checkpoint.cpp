#include "activation_checkpoint.h"

#include <cstdint>

#include <ATen/Context.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

namespace lockstep {
namespace distributed {
namespace detail {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct Recompute : torch::autograd::Function<Recompute> {
  // `inner` travels as an address in the context: it outlives the graph (the engine holds it).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, at::TensorList params,
                            torch::nn::AnyModule* inner) {
    ctx->save_for_backward({input});
    ctx->saved_data["inner"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(inner));
    ctx->saved_data["rng"] = generator(input).get_state();
    return inner->forward(input);  // grad mode is off here: nothing is saved
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto* inner = reinterpret_cast<torch::nn::AnyModule*>(static_cast<intptr_t>(ctx->saved_data["inner"].toInt()));
    const auto saved = ctx->get_saved_variables();
    const auto input = saved[0].detach().requires_grad_(saved[0].requires_grad());
    // The parameters forward was given, as the module now holds them (whole again: the engine
    // gathered them).
    const auto params = inner->ptr()->parameters();
    at::Tensor output;
    {
      // The same random numbers as the first forward (dropout), then the stream as it was.
      auto rng = generator(input);
      const auto now = rng.get_state();
      rng.set_state(ctx->saved_data["rng"].toTensor());
      torch::AutoGradMode grad(true);
      output = inner->forward(input);
      rng.set_state(now);
    }
    std::vector<at::Tensor> wrt;
    if (input.requires_grad()) wrt.push_back(input);
    for (const auto& p : params) {
      if (p.requires_grad()) wrt.push_back(p);
    }
    const auto grads = torch::autograd::grad({output}, wrt, {grad_outputs[0]}, /*retain_graph=*/false,
                                             /*create_graph=*/false, /*allow_unused=*/true);
    // One gradient per argument of forward: the input, each parameter, none for `inner`.
    variable_list result;
    size_t next = 0;
    result.push_back(input.requires_grad() ? grads[next++] : at::Tensor());
    for (const auto& p : params) result.push_back(p.requires_grad() ? grads[next++] : at::Tensor());
    result.push_back(at::Tensor());
    return result;
  }

  static at::Generator generator(const at::Tensor& input) {
    return at::globalContext().defaultGenerator(input.device());
  }
};

}  // namespace

at::Tensor checkpointed_forward(torch::nn::AnyModule& inner, const at::Tensor& input) {
  const auto params = inner.ptr()->parameters();
  bool needs_grad = input.requires_grad();
  for (const auto& p : params) needs_grad = needs_grad || p.requires_grad();
  if (!torch::GradMode::is_enabled() || !needs_grad) return inner.forward(input);
  return Recompute::apply(input, at::TensorList(params), &inner);
}

}  // namespace detail
}  // namespace distributed
}  // namespace lockstep
