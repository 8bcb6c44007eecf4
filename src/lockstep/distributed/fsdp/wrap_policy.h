#pragma once
// The wrap policy: which children of a module become units of their own (not installed).

#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>

#include <lockstep/distributed/fsdp/sharding_options.h>

namespace lockstep {
namespace distributed {
namespace detail {

// A child of a Sequential that becomes a unit.
struct ChildUnit {
  std::string name;  // its path in the module: "layers.3"
  torch::nn::SequentialImpl* parent;
  size_t index;
  bool checkpointed;
};

/// The children that become units, in the module's order: each child of a torch::nn::Sequential
/// (anywhere in `module`) with at least ShardingOptions::auto_wrap_min_params parameters (0: none
/// by size), or of a type that auto_wrap_module_types or activation_checkpointing_module_types
/// names (with or without namespace and "Impl"); a unit's own children are not searched. Throws
/// UsageError for a type named that no child has, listing the types there are.
std::vector<ChildUnit> find_units(torch::nn::Module& module, const ShardingOptions& options);

}  // namespace detail
}  // namespace distributed
}  // namespace lockstep
