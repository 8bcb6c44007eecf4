#include <lockstep/environments/torchelastic_environment.h>

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
  placement_.global_rank = detail::require_int(env, "RANK", kSetByTorchrun);
  if (!env.has("WORLD_SIZE")) {
    throw EnvironmentError("RANK=" + std::to_string(placement_.global_rank) +
                           " is set but WORLD_SIZE is not: torchrun sets both; set WORLD_SIZE "
                           "to the number of processes or unset RANK.");
  }
  placement_.world_size = detail::require_int(env, "WORLD_SIZE", kSetByTorchrun);
  placement_.local_rank = detail::require_int(env, "LOCAL_RANK", kSetByTorchrun);
  placement_.local_world_size = detail::require_int(env, "LOCAL_WORLD_SIZE", kSetByTorchrun);
  placement_.node_rank = detail::require_int(env, "GROUP_RANK", kSetByTorchrun);
  detail::check_positive("WORLD_SIZE", placement_.world_size);
  detail::check_positive("LOCAL_WORLD_SIZE", placement_.local_world_size);
  detail::check_rank_below("RANK", placement_.global_rank, "WORLD_SIZE", placement_.world_size);
  detail::check_rank_below("LOCAL_RANK", placement_.local_rank, "LOCAL_WORLD_SIZE", placement_.local_world_size);
  if (placement_.local_world_size > placement_.world_size) {
    throw EnvironmentError("LOCAL_WORLD_SIZE=" + std::to_string(placement_.local_world_size) +
                           " exceeds WORLD_SIZE=" + std::to_string(placement_.world_size) +
                           ": a node cannot run more processes than the whole job. Check that "
                           "both come from the same torchrun launch.");
  }

  placement_.main_address = env.get("MASTER_ADDR").value_or("127.0.0.1");
  auto port = env.get("MASTER_PORT");
  if (!port) {
    throw EnvironmentError(
        "MASTER_PORT is not set: torchrun sets it in every worker (default 29500). Launch with "
        "torchrun --master_port=PORT, or set MASTER_PORT to the port of rank 0's store.");
  }
  placement_.main_port = detail::parse_port("MASTER_PORT", *port);

  // PyTorch's rule (torch/distributed/rendezvous.py): only the exact string "True" counts.
  placement_.use_agent_store = env.get("TORCHELASTIC_USE_AGENT_STORE") == std::optional<std::string>("True");
  placement_.restart_count = env.get_int("TORCHELASTIC_RESTART_COUNT").value_or(0);
  placement_.store_file = env.get("LOCKSTEP_STORE_FILE").value_or("");
  if (placement_.use_agent_store && !env.has("TORCHELASTIC_RESTART_COUNT")) {
    throw EnvironmentError(
        "TORCHELASTIC_USE_AGENT_STORE=True but TORCHELASTIC_RESTART_COUNT is not set: the ranks "
        "meet under the key prefix of their attempt in torchrun's store, and torchrun sets both. "
        "Launch with torchrun, or set TORCHELASTIC_RESTART_COUNT=0.");
  }
}

TorchElasticEnvironment::TorchElasticEnvironment(const distributed::Placement& placement) {
  placement_ = placement;
}

void TorchElasticEnvironment::validate_settings(int devices, int num_nodes) const {
  if (placement_.local_world_size != devices) {
    throw EnvironmentError(
        "You set --devices=" + std::to_string(devices) + " but torchrun started " +
        "LOCAL_WORLD_SIZE=" + std::to_string(placement_.local_world_size) +
        " processes on this node. Use --devices " + std::to_string(placement_.local_world_size) +
        ", or torchrun --nproc_per_node=" + std::to_string(devices) + ".");
  }
  if (placement_.world_size != devices * num_nodes) {
    std::string fix = placement_.world_size % placement_.local_world_size == 0
                          ? "Use --num-nodes " + std::to_string(placement_.world_size / placement_.local_world_size)
                          : "Use --devices and --num-nodes whose product is " +
                                std::to_string(placement_.world_size);
    throw EnvironmentError("You set --devices=" + std::to_string(devices) +
                           " --num-nodes=" + std::to_string(num_nodes) + " (" +
                           std::to_string(devices * num_nodes) +
                           " processes in all) but torchrun's WORLD_SIZE=" +
                           std::to_string(placement_.world_size) + ". " + fix + ", or torchrun --nnodes=" +
                           std::to_string(num_nodes) + ".");
  }
}

}  // namespace environments
}  // namespace lockstep
