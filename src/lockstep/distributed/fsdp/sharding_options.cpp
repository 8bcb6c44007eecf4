#include <lockstep/distributed/fsdp/sharding_options.h>

#include <algorithm>
#include <cctype>

#include <lockstep/core/error.h>

namespace lockstep {
namespace distributed {

ShardingStrategy parse_sharding_strategy(const std::string& name) {
  std::string upper = name;
  std::transform(upper.begin(), upper.end(), upper.begin(), [](unsigned char c) { return std::toupper(c); });
  for (auto s : {ShardingStrategy::no_shard, ShardingStrategy::shard_optimizer_state, ShardingStrategy::shard_grad_op,
                 ShardingStrategy::full_shard, ShardingStrategy::hybrid_shard}) {
    if (to_string(s) == upper) return s;
  }
  throw UsageError("unknown sharding strategy '" + name +
                   "'; use FULL_SHARD, SHARD_GRAD_OP, SHARD_OPTIMIZER_STATE (ZeRO-1), HYBRID_SHARD or NO_SHARD.");
}

std::string to_string(ShardingStrategy strategy) {
  switch (strategy) {
    case ShardingStrategy::no_shard: return "NO_SHARD";
    case ShardingStrategy::shard_optimizer_state: return "SHARD_OPTIMIZER_STATE";
    case ShardingStrategy::shard_grad_op: return "SHARD_GRAD_OP";
    case ShardingStrategy::full_shard: return "FULL_SHARD";
    case ShardingStrategy::hybrid_shard: return "HYBRID_SHARD";
  }
  return "?";
}

}  // namespace distributed
}  // namespace lockstep
