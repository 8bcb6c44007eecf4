#pragma once
/// state_dict / load_state_dict for torch::nn::Module, with the keys and order of Python's
/// `module.state_dict()`, so a checkpoint's weights load into the equivalent Python module.

#include <string>
#include <vector>

#include <ATen/core/Dict.h>
#include <torch/nn/module.h>

namespace lockstep {
namespace checkpoint {

/// Parameters and buffers of `module` by dotted name ("fc1.weight", "bn.running_mean",
/// "bn.num_batches_tracked"), in Python's order: a module's own parameters, then its own
/// buffers, then each child's in registration order. Undefined tensors (a Linear without bias)
/// are left out, as Python leaves out None. The tensors are detached and share storage with
/// the module, like Python's.
///   ckpt.insert("state_dict", state_dict(*model));
c10::Dict<std::string, torch::Tensor> state_dict(const torch::nn::Module& module);

/// Keys that load_state_dict could not match (only non-empty with strict=false).
struct LoadStateDictResult {
  std::vector<std::string> missing_keys;     ///< in the module, absent from the dict
  std::vector<std::string> unexpected_keys;  ///< in the dict, absent from the module
};

/// What load_state_dict(module, state, strict) would refuse, found without copying anything, for
/// callers that name their own fix (the Trainer names its flags).
struct StateDictCheck {
  /// Every difference, "size mismatch for fc1.weight: the checkpoint has [16, 10], the model
  /// [16, 8]; missing keys: ...; unexpected keys: ...", or "" when it would load.
  std::string mismatch;
  /// Only names differ (no shape, no value that is not a tensor): strict=false would load it.
  bool only_names = false;
  /// The KeyMap prefix rule (from, to) that explains every name difference, when one does.
  std::string rename_from, rename_to;
  LoadStateDictResult keys;
};

/// Checks `state` against `module`'s parameters and buffers as load_state_dict does.
StateDictCheck check_state_dict(const torch::nn::Module& module, const c10::impl::GenericDict& state,
                                bool strict = true);
/// The same against the tensors a module's state_dict holds (a strategy's module_state_dict).
StateDictCheck check_state_dict(const c10::Dict<std::string, torch::Tensor>& targets,
                                const c10::impl::GenericDict& state, bool strict = true);

/// Copies `state` (name -> tensor, e.g. `ckpt.at("state_dict").toGenericDict()`) into the
/// module's parameters and buffers, without recording autograd history. Values are converted to
/// each parameter's dtype and device, as Python's `load_state_dict` does. Throws UsageError
/// listing every shape mismatch and non-tensor value; with strict=true (default) also every
/// missing and unexpected key. Nothing is copied when it throws.
LoadStateDictResult load_state_dict(torch::nn::Module& module, const c10::impl::GenericDict& state,
                                    bool strict = true);

/// Same, for the dict state_dict() returns.
LoadStateDictResult load_state_dict(torch::nn::Module& module, const c10::Dict<std::string, torch::Tensor>& state,
                                    bool strict = true);

}  // namespace checkpoint
}  // namespace lockstep
