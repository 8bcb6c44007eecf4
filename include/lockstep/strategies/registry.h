#pragma once
/// The strategy registry: names users pass to --strategy, each a factory with bound options
/// (`ddp`, `ddp_fork` and `ddp_find_unused_parameters_true` are one DDPStrategy class).

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <lockstep/strategies/strategy.h>

namespace lockstep {
namespace strategies {

using StrategyFactory = std::function<std::shared_ptr<Strategy>()>;

/// Adds (or replaces) a name. Returns true, so it can initialise a static:
///   static const bool registered = register_strategy("my_ddp", [] { return std::make_shared<MyDDP>(); },
///                                                    "DDP with my wrapper");
bool register_strategy(const std::string& name, StrategyFactory factory, const std::string& description = "");
/// A new strategy for `name`; an unknown name is a UsageError listing the registered ones.
std::shared_ptr<Strategy> create_strategy(const std::string& name);
bool is_registered(const std::string& name);
/// Registered names, sorted.
std::vector<std::string> available_strategies();

}  // namespace strategies
}  // namespace lockstep
