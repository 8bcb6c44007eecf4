#include "lockstep/environments/torchelastic_environment.h"

#include <optional>
#include <string>

namespace lockstep {
namespace environments {
namespace {

const char* const kSetByTorchrun =
    "torchrun sets it in every worker. Launch with torchrun, or set it to the value torchrun "
    "would use.";

}  // namespace

bool TorchElasticEnvironment::detect(const Environ& env) {
  return env.has("RANK") && env.has("GROUP_RANK") && env.has("LOCAL_RANK") &&
         env.has("LOCAL_WORLD_SIZE");
}

TorchElasticEnvironment::TorchElasticEnvironment(const Environ& env) {
  global_rank_ = detail::require_int(env, "RANK", kSetByTorchrun);
  if (!env.has("WORLD_SIZE")) {
    throw EnvironmentError("RANK=" + std::to_string(global_rank_) +
                           " is set but WORLD_SIZE is not: torchrun sets both; set WORLD_SIZE "
                           "to the number of processes or unset RANK.");
  }
  world_size_ = detail::require_int(env, "WORLD_SIZE", kSetByTorchrun);
  local_rank_ = detail::require_int(env, "LOCAL_RANK", kSetByTorchrun);
  local_world_size_ = detail::require_int(env, "LOCAL_WORLD_SIZE", kSetByTorchrun);
  node_rank_ = detail::require_int(env, "GROUP_RANK", kSetByTorchrun);
  detail::check_positive("WORLD_SIZE", world_size_);
  detail::check_positive("LOCAL_WORLD_SIZE", local_world_size_);
  detail::check_rank_below("RANK", global_rank_, "WORLD_SIZE", world_size_);
  detail::check_rank_below("LOCAL_RANK", local_rank_, "LOCAL_WORLD_SIZE", local_world_size_);
  if (local_world_size_ > world_size_) {
    throw EnvironmentError("LOCAL_WORLD_SIZE=" + std::to_string(local_world_size_) +
                           " exceeds WORLD_SIZE=" + std::to_string(world_size_) +
                           ": a node cannot run more processes than the whole job. Check that "
                           "both come from the same torchrun launch.");
  }

  main_address_ = env.get("MASTER_ADDR").value_or("127.0.0.1");
  auto port = env.get("MASTER_PORT");
  if (!port) {
    throw EnvironmentError(
        "MASTER_PORT is not set: torchrun sets it in every worker (default 29500). Launch with "
        "torchrun --master_port=PORT, or set MASTER_PORT to the port of rank 0's store.");
  }
  main_port_ = detail::parse_port("MASTER_PORT", *port);

  // PyTorch's rule (torch/distributed/rendezvous.py): only the exact string "True" counts.
  use_agent_store_ = env.get("TORCHELASTIC_USE_AGENT_STORE") == std::optional<std::string>("True");
  restart_count_ = env.get_int("TORCHELASTIC_RESTART_COUNT").value_or(0);
  store_file_ = env.get("LOCKSTEP_STORE_FILE").value_or("");
  if (use_agent_store_ && !env.has("TORCHELASTIC_RESTART_COUNT")) {
    throw EnvironmentError(
        "TORCHELASTIC_USE_AGENT_STORE=True but TORCHELASTIC_RESTART_COUNT is not set: the ranks "
        "meet under the key prefix of their attempt in torchrun's store, and torchrun sets both. "
        "Launch with torchrun, or set TORCHELASTIC_RESTART_COUNT=0.");
  }
}

void TorchElasticEnvironment::validate_settings(int devices, int num_nodes) const {
  if (local_world_size_ != devices) {
    throw EnvironmentError(
        "You set --devices=" + std::to_string(devices) + " but torchrun started " +
        "LOCAL_WORLD_SIZE=" + std::to_string(local_world_size_) +
        " processes on this node. Use --devices " + std::to_string(local_world_size_) +
        ", or torchrun --nproc_per_node=" + std::to_string(devices) + ".");
  }
  if (world_size_ != devices * num_nodes) {
    std::string fix = world_size_ % local_world_size_ == 0
                          ? "Use --num-nodes " + std::to_string(world_size_ / local_world_size_)
                          : "Use --devices and --num-nodes whose product is " +
                                std::to_string(world_size_);
    throw EnvironmentError("You set --devices=" + std::to_string(devices) +
                           " --num-nodes=" + std::to_string(num_nodes) + " (" +
                           std::to_string(devices * num_nodes) +
                           " processes in all) but torchrun's WORLD_SIZE=" +
                           std::to_string(world_size_) + ". " + fix + ", or torchrun --nnodes=" +
                           std::to_string(num_nodes) + ".");
  }
}

}  // namespace environments
}  // namespace lockstep
