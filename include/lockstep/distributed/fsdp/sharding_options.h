#pragma once
/// Options for FullyShardedDataParallel.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <c10/core/ScalarType.h>
#include <torch/arg.h>

namespace lockstep {
namespace distributed {

/// What each rank keeps whole and what it keeps a 1/N shard of (ZeRO, Rajbhandari et al. 2020;
/// the names are PyTorch FSDP's and Lightning's FSDPStrategy's, plus ZeRO-1).
enum class ShardingStrategy {
  /// Nothing sharded: gradients all-reduced, every rank steps everything (DDP, for comparison).
  no_shard,
  /// ZeRO-1: gradients all-reduced and kept whole; each rank steps and keeps optimizer state for
  /// its shard only; parameters all-gathered before the next forward.
  shard_optimizer_state,
  /// ZeRO-2: gradients reduce-scattered, each rank keeping its shard; parameters whole between
  /// forward and backward, all-gathered after the step.
  shard_grad_op,
  /// ZeRO-3: parameters sharded at rest as well, all-gathered unit by unit before its forward and
  /// again before its backward, and freed after each.
  full_shard,
  /// FULL_SHARD inside each group of ShardingOptions::hybrid_shard_size ranks (by default the
  /// ranks of one host), the groups replicas of each other: parameters are gathered and gradients
  /// reduce-scattered inside the group, then each shard's gradients all-reduced across the groups
  /// (PyTorch FSDP's HYBRID_SHARD). Memory as FULL_SHARD on that many ranks; between hosts only
  /// one all-reduce of a shard per unit and step.
  hybrid_shard,
};

/// "NO_SHARD", "SHARD_OPTIMIZER_STATE", "SHARD_GRAD_OP", "FULL_SHARD", "HYBRID_SHARD" (case-insensitive);
/// anything else throws UsageError listing them.
ShardingStrategy parse_sharding_strategy(const std::string& name);
std::string to_string(ShardingStrategy strategy);

/// How FullyShardedDataParallel shards a module.
///
///   FullyShardedDataParallel fsdp(net, *group, ShardingOptions().auto_wrap_min_params(1'000'000));
///   FullyShardedDataParallel fsdp(net, *group, ShardingOptions().activation_checkpointing_module_types({"Block"}));
struct ShardingOptions {
  /// Default: full_shard, as PyTorch's FSDP and Lightning's FSDPStrategy.
  TORCH_ARG(ShardingStrategy, sharding_strategy) = ShardingStrategy::full_shard;
  /// Units (the auto-wrap policy, by size): every child of a torch::nn::Sequential, anywhere in
  /// the module, with at least this many parameters becomes a unit of its own, gathered only
  /// around its own forward and backward (it must take and return one tensor); the rest of the
  /// module is the root unit. 0: the whole module is one unit. Default: 0, as Lightning's
  /// FSDPStrategy without an auto_wrap_policy.
  TORCH_ARG(int64_t, auto_wrap_min_params) = 0;
  /// Units by type (the auto-wrap policy, by module type): every child of a Sequential whose
  /// type is one of these is a unit, whatever its size. A type is named as Module::name() gives
  /// it, with or without its namespace and "Impl": "Block" matches my::BlockImpl. A name that
  /// matches no child of a Sequential is a UsageError listing those there are.
  TORCH_ARG(std::vector<std::string>, auto_wrap_module_types) = {};
  /// Activation checkpointing by module type (named as above): children of a Sequential of these
  /// types become units whose forward keeps no activations, only its input; backward runs their
  /// forward again (with the random numbers of the first: dropout masks repeat) and
  /// differentiates that. Memory for one more forward of those units. Default: none.
  TORCH_ARG(std::vector<std::string>, activation_checkpointing_module_types) = {};
  /// With HYBRID_SHARD: how many consecutive ranks shard one copy of the model (ranks 0..k-1,
  /// k..2k-1, ...); it must divide the world size. 0: the ranks of each host, which must be
  /// consecutive and as many on every host (as torchrun and SLURM place them). Default: 0.
  TORCH_ARG(int, hybrid_shard_size) = 0;
  /// Mixed precision (PyTorch FSDP's MixedPrecision::param_dtype): the dtype the child units'
  /// parameters are gathered in and their forward and backward compute in (at::kBFloat16): a
  /// unit's input is cast to it and its output back. The shards, their gradients and the
  /// optimizer stay in the parameters' own dtype, and so does the root unit (the parts of the
  /// model in no child unit). Needs child units and parameters gathered before forward
  /// (FULL_SHARD, HYBRID_SHARD, SHARD_GRAD_OP). Default: none (the parameters' dtype).
  TORCH_ARG(std::optional<at::ScalarType>, param_dtype) = std::nullopt;
  /// The dtype gradients are reduced in (MixedPrecision::reduce_dtype): each unit's gradients
  /// are cast to it before the reduce-scatter (all-reduce), summed in float32, and added to the
  /// kept gradients in their own dtype. Half the bytes between ranks with at::kBFloat16.
  /// Default: none (the parameters' dtype).
  TORCH_ARG(std::optional<at::ScalarType>, reduce_dtype) = std::nullopt;
  /// Reduce-scatter and all-gather in memory shared by the ranks of one host (CPU float32 and
  /// float64 parameters, more than one rank), as DDPOptions::shared_memory; otherwise through
  /// the process group. LOCKSTEP_DDP_SHARED_MEMORY=0 turns it off too. Default: true.
  TORCH_ARG(bool, shared_memory) = true;
};

}  // namespace distributed
}  // namespace lockstep
