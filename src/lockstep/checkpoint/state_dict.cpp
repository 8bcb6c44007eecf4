#include <lockstep/checkpoint/state_dict.h>

#include <tuple>

#include <torch/torch.h>

#include <lockstep/core/error.h>

#include "prefix_rule.h"

namespace lockstep {
namespace checkpoint {
namespace {

void collect(const torch::nn::Module& module, const std::string& prefix, c10::Dict<std::string, torch::Tensor>& out) {
  for (const auto& item : module.named_parameters(/*recurse=*/false)) {
    if (item.value().defined()) out.insert(prefix + item.key(), item.value().detach());
  }
  for (const auto& item : module.named_buffers(/*recurse=*/false)) {
    if (item.value().defined()) out.insert(prefix + item.key(), item.value().detach());
  }
  for (const auto& child : module.named_children()) collect(*child.value(), prefix + child.key() + ".", out);
}

std::string shape(const torch::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

std::string list(const std::vector<std::string>& items) {
  constexpr size_t kShown = 8;
  std::string s;
  for (size_t i = 0; i < items.size() && i < kShown; ++i) s += (i ? ", " : "") + items[i];
  if (items.size() > kShown) s += ", ... (" + std::to_string(items.size() - kShown) + " more)";
  return s;
}

// The one message for every way a state_dict and a model differ, with the KeyMap rule that
// would reconcile the names when one explains them all.
std::string mismatch_message(const StateDictCheck& check) {
  const std::string message = "the state_dict does not match the model (" + check.mismatch + "). ";
  if (!check.rename_from.empty() || !check.rename_to.empty()) {
    return message + "Its names differ from the model's by a prefix: map them with KeyMap().rename_prefix(\"" +
           check.rename_from + "\", \"" + check.rename_to + "\") (the Trainer's --init-weights-rename '" +
           check.rename_from + "=" + check.rename_to + "').";
  }
  if (check.only_names) {
    return message + "It was saved from a different model: load a checkpoint of this model, build the model with "
                     "the same layers and names, map the names with a KeyMap, or load with strict=false to skip the "
                     "missing and unexpected names (the Trainer's --init-weights-strict false).";
  }
  return message + "It was saved from a different model: load a checkpoint of this model, or build the model with "
                   "the checkpoint's sizes; strict=false skips names, not shapes.";
}

}  // namespace

c10::Dict<std::string, torch::Tensor> state_dict(const torch::nn::Module& module) {
  c10::Dict<std::string, torch::Tensor> out;
  collect(module, "", out);
  return out;
}

StateDictCheck check_state_dict(const c10::Dict<std::string, torch::Tensor>& targets,
                                const c10::impl::GenericDict& state, bool strict) {
  StateDictCheck check;
  std::vector<std::string> problems;
  for (const auto& entry : state) {
    const std::string key = entry.key().isString() ? entry.key().toStringRef() : "<" + entry.key().type()->str() + " key>";
    if (!entry.key().isString() || !targets.contains(key)) {
      check.keys.unexpected_keys.push_back(key);
      continue;
    }
    if (!entry.value().isTensor()) {
      problems.push_back(key + " holds a " + entry.value().type()->str() + ", not a tensor");
      continue;
    }
    const torch::Tensor source = entry.value().toTensor();
    const torch::Tensor target = targets.at(key);
    if (source.sizes() != target.sizes()) {
      problems.push_back("size mismatch for " + key + ": the checkpoint has " + shape(source) + ", the model " +
                         shape(target));
    }
  }
  for (const auto& entry : targets) {
    if (!state.contains(entry.key())) check.keys.missing_keys.push_back(entry.key());
  }
  check.only_names = problems.empty();
  if (strict && !check.keys.missing_keys.empty()) problems.push_back("missing keys: " + list(check.keys.missing_keys));
  if (strict && !check.keys.unexpected_keys.empty()) {
    problems.push_back("unexpected keys: " + list(check.keys.unexpected_keys));
  }
  for (size_t i = 0; i < problems.size(); ++i) check.mismatch += (i ? "; " : "") + problems[i];
  if (!check.mismatch.empty()) {
    std::tie(check.rename_from, check.rename_to) =
        detail::suggest_prefix_rule(check.keys.unexpected_keys, check.keys.missing_keys);
  }
  return check;
}

StateDictCheck check_state_dict(const torch::nn::Module& module, const c10::impl::GenericDict& state, bool strict) {
  return check_state_dict(state_dict(module), state, strict);
}

LoadStateDictResult load_state_dict(torch::nn::Module& module, const c10::impl::GenericDict& state, bool strict) {
  const auto targets = state_dict(module);
  const StateDictCheck check = check_state_dict(targets, state, strict);
  if (!check.mismatch.empty()) throw UsageError(mismatch_message(check));
  torch::NoGradGuard no_grad;
  for (const auto& entry : targets) {
    if (state.contains(entry.key())) entry.value().copy_(state.at(entry.key()).toTensor());
  }
  return check.keys;
}

LoadStateDictResult load_state_dict(torch::nn::Module& module, const c10::Dict<std::string, torch::Tensor>& state,
                                    bool strict) {
  return load_state_dict(module, c10::impl::toGenericDict(state), strict);
}

}  // namespace checkpoint
}  // namespace lockstep
