#include "lockstep/environments/kubeflow_environment.h"

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
  world_size_ = detail::require_int(env, "WORLD_SIZE", kSetByOperator);
  global_rank_ = detail::require_int(env, "RANK", kSetByOperator);
  detail::check_positive("WORLD_SIZE", world_size_);
  detail::check_rank_below("RANK", global_rank_, "WORLD_SIZE", world_size_);
  auto address = env.get("MASTER_ADDR");
  if (!address || address->empty()) {
    throw EnvironmentError(std::string("MASTER_ADDR is not set: ") + kSetByOperator);
  }
  main_address_ = *address;
  auto port = env.get("MASTER_PORT");
  if (!port) throw EnvironmentError(std::string("MASTER_PORT is not set: ") + kSetByOperator);
  main_port_ = detail::parse_port("MASTER_PORT", *port);
}

void KubeflowEnvironment::validate_settings(int devices, int num_nodes) const {
  if (devices != 1) {
    throw EnvironmentError(
        "You set --devices=" + std::to_string(devices) +
        " but a Kubeflow PyTorchJob runs one process per pod. Use --devices 1, or start "
        "torchrun --nproc_per_node=" + std::to_string(devices) +
        " in each pod (Lockstep then detects torchelastic).");
  }
  if (num_nodes != world_size_) {
    throw EnvironmentError("You set --num-nodes=" + std::to_string(num_nodes) +
                           " but the PyTorchJob has WORLD_SIZE=" + std::to_string(world_size_) +
                           " pods, one process each. Use --num-nodes " +
                           std::to_string(world_size_) + ", or change the job's replicas.");
  }
}

}  // namespace environments
}  // namespace lockstep
