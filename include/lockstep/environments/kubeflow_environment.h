#pragma once
/// KubeflowEnvironment: one process per pod of a Kubeflow PyTorchJob.

#include <string>

#include <lockstep/environments/cluster_environment.h>

namespace lockstep {
namespace environments {

/// The environment of a pod of a Kubeflow PyTorchJob, where the operator starts one process per
/// pod (master and workers). Detected when KUBERNETES_PORT, MASTER_ADDR, MASTER_PORT,
/// WORLD_SIZE and RANK are all set (Lightning's former rule; current Lightning no longer
/// auto-detects Kubeflow). torchrun inside a pod sets GROUP_RANK and LOCAL_WORLD_SIZE as well,
/// and then torchelastic is detected first. Values, read at construction:
///   world_size    WORLD_SIZE (one process per pod, so also the number of pods)
///   global_rank   RANK
///   local_rank    0
///   node_rank     RANK (each pod is a node)
///   main_address  MASTER_ADDR (the master pod's service name)
///   main_port     MASTER_PORT
/// Example: a PyTorchJob with 1 master + 3 workers, each running `./train --num-nodes 4`.
class KubeflowEnvironment : public ClusterEnvironment {
 public:
  /// Throws EnvironmentError for a missing or invalid variable or RANK >= WORLD_SIZE.
  explicit KubeflowEnvironment(const Environ& env);

  static bool detect(const Environ& env);

  std::string name() const override { return "kubeflow"; }
  bool creates_processes_externally() const override { return true; }

  /// One process per pod: `devices` must be 1 and `num_nodes` must equal WORLD_SIZE; otherwise
  /// EnvironmentError naming --devices / --num-nodes (or torchrun inside the pod).
  void validate_settings(int devices, int num_nodes) const override;

};

}  // namespace environments
}  // namespace lockstep
