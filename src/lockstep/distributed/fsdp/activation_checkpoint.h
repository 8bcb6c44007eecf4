#pragma once
// Activation checkpointing for the sharded engine's units (not installed): a unit's forward keeps
// no activations for backward, only its input; backward runs the forward again (with the random
// number generator as it was) and differentiates that.

#include <ATen/core/Tensor.h>
#include <torch/nn/modules/container/any.h>

namespace lockstep {
namespace distributed {
namespace detail {

/// `inner.forward(input)` without saving its activations: the result's backward recomputes them
/// and passes the gradients on to `input` and to inner's parameters. With grad mode off, or
/// nothing requiring grad, it is the plain forward. `inner` must outlive the result's graph.
at::Tensor checkpointed_forward(torch::nn::AnyModule& inner, const at::Tensor& input);

}  // namespace detail
}  // namespace distributed
}  // namespace lockstep
