#include <lockstep/distributed/wrapped_parameters.h>

#include <algorithm>

#include <lockstep/core/error.h>

namespace lockstep {
namespace distributed {

WrappedParameters::WrappedParameters(const torch::nn::Module& module, std::string wrapper) : wrapper_(std::move(wrapper)) {
  for (const auto& item : module.named_parameters()) {
    tensors_.push_back(item.value().unsafeGetTensorImpl());
    names_.push_back(item.key());
  }
}

void WrappedParameters::check(const torch::nn::Module& module) const {
  const auto tensors = module.parameters();
  size_t k = 0;
  while (k < tensors.size() && k < tensors_.size() && tensors[k].unsafeGetTensorImpl() == tensors_[k]) ++k;
  if (k == tensors.size() && k == tensors_.size()) return;
  const auto now = module.named_parameters();
  const std::string fix = " Register every parameter before wrapping the module (in its constructor; with the Trainer "
                          "or Fabric, before fit() or setup()), or wrap it again.";
  if (k == now.size()) {
    throw UsageError(wrapper_ + ": parameter '" + names_[k] + "' was removed from the module after it was wrapped (" +
                     std::to_string(now.size()) + " parameters now, " + std::to_string(tensors_.size()) +
                     " then)." + fix);
  }
  const auto& name = now[k].key();
  const bool replaced = std::find(names_.begin(), names_.end(), name) != names_.end();
  throw UsageError(wrapper_ + ": parameter '" + name + "' was " + (replaced ? "replaced on" : "registered on") +
                   " the module after it was wrapped: no gradient reduction includes it, so the ranks would drift "
                   "apart." + fix);
}

}  // namespace distributed
}  // namespace lockstep
