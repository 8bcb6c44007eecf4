#pragma once
// ShardingPlan: what a ShardingStrategy means for the engine, decided once, so that the units ask
// what to do rather than which strategy they are under (not installed).

#include <lockstep/distributed/fsdp/sharding_options.h>

namespace lockstep {
namespace distributed {
namespace detail {

struct ShardingPlan {
  /// Parameters split over the shard group (all but NO_SHARD): a step changes this rank's shard,
  /// and the next forward gathers the whole parameters again.
  bool sharded = true;
  /// Whole parameters freed after each use and gathered again for backward (FULL_SHARD,
  /// HYBRID_SHARD); otherwise they stay in memory from forward to the step.
  bool reshard_after_use = true;
  /// Every rank keeps the whole gradients, all-reduced (NO_SHARD, ZeRO-1); otherwise its shard.
  bool whole_gradients = false;

  static ShardingPlan of(ShardingStrategy strategy) {
    ShardingPlan plan;
    plan.sharded = strategy != ShardingStrategy::no_shard;
    plan.reshard_after_use = strategy == ShardingStrategy::full_shard || strategy == ShardingStrategy::hybrid_shard;
    plan.whole_gradients =
        strategy == ShardingStrategy::no_shard || strategy == ShardingStrategy::shard_optimizer_state;
    return plan;
  }
};

}  // namespace detail
}  // namespace distributed
}  // namespace lockstep
