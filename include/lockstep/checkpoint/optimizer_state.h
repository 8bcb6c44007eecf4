#pragma once
/// Optimizer state in Python's layout, so a checkpoint resumes bit-exactly in C++ and loads into
/// `torch.optim.SGD/Adam/AdamW.load_state_dict` in Python.

#include <ATen/core/Dict.h>
#include <torch/optim/optimizer.h>

namespace lockstep {
namespace checkpoint {

/// The state of a torch::optim::SGD, Adam or AdamW as Python's `optimizer.state_dict()` lays it
/// out:
///   {"state": {0: {"momentum_buffer": T}, ...},            // SGD with momentum
///    "state": {0: {"step": T, "exp_avg": T, "exp_avg_sq": T[, "max_exp_avg_sq": T]}, ...}  // Adam(W)
///    "param_groups": [{"lr": 0.1, "momentum": 0.9, ..., "params": [0, 1, ...]}, ...]}
/// Parameters are numbered across groups in order, as Python numbers them. Adam's step is a
/// float64 scalar tensor (Python uses float32; float64 keeps steps past 2^24 exact), and
/// Python-only options are written with the values LibTorch implies (maximize=False,
/// foreach=None, ...). The tensors share the optimizer's memory, as PyTorch's
/// optimizer.state_dict(): clone them to keep values past the next step (a save writes them
/// before that, and copies nothing). Throws UsageError for other optimizer types.
///   ckpt.insert("optimizer_states", c10::List<c10::IValue>({optimizer_state_dict(adam)}));
c10::impl::GenericDict optimizer_state_dict(const torch::optim::Optimizer& optimizer);

/// Restores a dict from optimizer_state_dict() into `optimizer` (the same type, the same number
/// of groups and of parameters per group): every group's options (lr, momentum, betas, ...) and
/// every parameter's state. A state tensor of the parameter's dtype and device becomes the
/// optimizer's as it is (the dict and the optimizer then share it, as after PyTorch's
/// load_state_dict); others are converted. Throws UsageError naming what does not match.
void load_optimizer_state_dict(torch::optim::Optimizer& optimizer, const c10::impl::GenericDict& state);

}  // namespace checkpoint
}  // namespace lockstep
