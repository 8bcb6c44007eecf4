#include <lockstep/environments/kubeflow_environment.h>

#include <string>

namespace lockstep {
namespace environments {
namespace {

const char* const kSetByOperator =
    "the PyTorchJob operator sets MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK in every pod. "
    "Check the pod spec (env, envFrom) does not drop or override it.";

}  // namespace

bool KubeflowEnvironment::detect(const Environ& env) {
  return env.has("KUBERNETES_PORT") && env.has("MASTER_ADDR") && env.has("MASTER_PORT") &&
         env.has("WORLD_SIZE") && env.has("RANK");
}

KubeflowEnvironment::KubeflowEnvironment(const Environ& env) {
  placement_.world_size = detail::require_int(env, "WORLD_SIZE", kSetByOperator);
  placement_.global_rank = detail::require_int(env, "RANK", kSetByOperator);
  detail::check_positive("WORLD_SIZE", placement_.world_size);
  detail::check_rank_below("RANK", placement_.global_rank, "WORLD_SIZE", placement_.world_size);
  auto address = env.get("MASTER_ADDR");
  if (!address || address->empty()) {
    throw EnvironmentError(std::string("MASTER_ADDR is not set: ") + kSetByOperator);
  }
  placement_.main_address = *address;
  auto port = env.get("MASTER_PORT");
  if (!port) throw EnvironmentError(std::string("MASTER_PORT is not set: ") + kSetByOperator);
  placement_.main_port = detail::parse_port("MASTER_PORT", *port);
  placement_.node_rank = placement_.global_rank;  // one process per pod
  placement_.local_world_size = 1;
}

void KubeflowEnvironment::validate_settings(int devices, int num_nodes) const {
  if (devices != 1) {
    throw EnvironmentError(
        "You set --devices=" + std::to_string(devices) +
        " but a Kubeflow PyTorchJob runs one process per pod. Use --devices 1, or start "
        "torchrun --nproc_per_node=" + std::to_string(devices) +
        " in each pod (Lockstep then detects torchelastic).");
  }
  if (num_nodes != placement_.world_size) {
    throw EnvironmentError("You set --num-nodes=" + std::to_string(num_nodes) +
                           " but the PyTorchJob has WORLD_SIZE=" + std::to_string(placement_.world_size) +
                           " pods, one process each. Use --num-nodes " +
                           std::to_string(placement_.world_size) + ", or change the job's replicas.");
  }
}

}  // namespace environments
}  // namespace lockstep
