#include "wrap_policy.h"

#include <algorithm>

#include <lockstep/core/error.h>

namespace lockstep {
namespace distributed {
namespace detail {
namespace {

int64_t parameter_count(torch::nn::Module& module) {
  int64_t count = 0;
  for (const auto& p : module.parameters()) count += p.numel();
  return count;
}

// "my::BlockImpl" -> "my::Block".
std::string without_impl(const std::string& name) {
  const std::string impl = "Impl";
  return name.size() > impl.size() && name.compare(name.size() - impl.size(), impl.size(), impl) == 0
             ? name.substr(0, name.size() - impl.size())
             : name;
}

// Whether a module whose Module::name() is `type_name` is named in `types` (with or without
// namespace and "Impl").
bool is_one_of(const std::string& type_name, const std::vector<std::string>& types) {
  const auto name = without_impl(type_name);
  for (const auto& given : types) {
    const auto type = without_impl(given);
    if (name == type || (name.size() > type.size() + 2 && name.compare(name.size() - type.size(), type.size(), type) == 0 &&
                         name.compare(name.size() - type.size() - 2, 2, "::") == 0)) {
      return true;
    }
  }
  return false;
}

struct UnitPolicy {
  int64_t min_params;
  std::vector<std::string> types, checkpointed;
  std::vector<std::string> seen;  // the types of Sequentials' children, for messages
};

void find_child_units(torch::nn::Module& module, const std::string& prefix, UnitPolicy& policy,
                      std::vector<ChildUnit>& found) {
  const auto children = module.named_children();
  if (auto* sequential = dynamic_cast<torch::nn::SequentialImpl*>(&module)) {
    for (size_t i = 0; i < children.size(); ++i) {
      auto& child = *children[i].value();
      policy.seen.push_back(child.name());
      const bool checkpointed = is_one_of(child.name(), policy.checkpointed);
      if ((policy.min_params > 0 && parameter_count(child) >= policy.min_params) || checkpointed ||
          is_one_of(child.name(), policy.types)) {
        found.push_back({prefix + children[i].key(), sequential, i, checkpointed});
      } else {
        find_child_units(child, prefix + children[i].key() + ".", policy, found);
      }
    }
    return;
  }
  for (const auto& child : children) find_child_units(*child.value(), prefix + child.key() + ".", policy, found);
}

// Every type the options name must be found, or the option would do nothing.
void check_types_found(const std::vector<std::string>& types, const char* option,
                       const std::vector<std::string>& seen) {
  for (const auto& type : types) {
    if (std::any_of(seen.begin(), seen.end(), [&](const std::string& name) { return is_one_of(name, {type}); })) {
      continue;
    }
    std::string names;
    for (const auto& name : seen) {
      if (names.find(" " + name + ",") == std::string::npos) names += " " + name + ",";
    }
    throw UsageError("ShardingOptions::" + std::string(option) + ": no child of a torch::nn::Sequential in the module "
                     "is of type '" + type + "'; the children there are of types" +
                     (names.empty() ? std::string(" (none: the module has no Sequential)") : names.substr(0, names.size() - 1)) +
                     ". Name one of those, or put the modules to wrap in a Sequential.");
  }
}

}  // namespace

std::vector<ChildUnit> find_units(torch::nn::Module& module, const ShardingOptions& options) {
  std::vector<ChildUnit> children;
  UnitPolicy policy{options.auto_wrap_min_params(), options.auto_wrap_module_types(),
                    options.activation_checkpointing_module_types(), {}};
  if (policy.min_params > 0 || !policy.types.empty() || !policy.checkpointed.empty()) {
    find_child_units(module, "", policy, children);
  }
  check_types_found(policy.types, "auto_wrap_module_types", policy.seen);
  check_types_found(policy.checkpointed, "activation_checkpointing_module_types", policy.seen);
  return children;
}

}  // namespace detail
}  // namespace distributed
}  // namespace lockstep
