#pragma once
// The hint of a state_dict mismatch: which KeyMap rule would make a file's names the module's.

#include <string>
#include <utility>
#include <vector>

namespace lockstep {
namespace checkpoint {
namespace detail {

/// The prefix rule (from, to) that turns every key of `unexpected` (in a file, not in the module)
/// into a key of `missing` (in the module, not in the file), when one rule explains them all:
/// ("model.", "") for a file whose keys carry "model." where the module's do not. {"", ""} when
/// no rule does.
std::pair<std::string, std::string> suggest_prefix_rule(const std::vector<std::string>& unexpected,
                                                        const std::vector<std::string>& missing);

}  // namespace detail
}  // namespace checkpoint
}  // namespace lockstep
