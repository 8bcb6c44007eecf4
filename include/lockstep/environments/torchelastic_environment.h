#pragma once
/// TorchElasticEnvironment: processes started by torchrun (or by Lockstep's own launcher,
/// which sets the same variables).

#include <string>

#include <lockstep/environments/cluster_environment.h>

namespace lockstep {
namespace environments {

/// The environment of a worker that torchrun started. Detected when RANK, GROUP_RANK,
/// LOCAL_RANK and LOCAL_WORLD_SIZE are all set (Lightning's rule). Values, read at construction:
///   world_size    WORLD_SIZE (required)
///   global_rank   RANK
///   local_rank    LOCAL_RANK (below LOCAL_WORLD_SIZE)
///   node_rank     GROUP_RANK
///   main_address  MASTER_ADDR, default "127.0.0.1"
///   main_port     MASTER_PORT (required; torchrun always sets it)
///   use_agent_store  TORCHELASTIC_USE_AGENT_STORE == "True" (as in PyTorch), default false:
///                 torchrun's static rendezvous (its default) hosts the store on MASTER_PORT itself
///   restart_count TORCHELASTIC_RESTART_COUNT, default 0; required with use_agent_store
/// Example: `torchrun --nnodes=2 --nproc_per_node=4 ... ./train --devices 4 --num-nodes 2`.
class TorchElasticEnvironment : public ClusterEnvironment {
 public:
  /// Throws EnvironmentError when a variable is missing, not an integer, or out of range.
  explicit TorchElasticEnvironment(const Environ& env);

  /// A worker that Lockstep's launcher started: the placement it handed over (the same values
  /// as the variables it sets for a re-executed worker).
  explicit TorchElasticEnvironment(const distributed::Placement& placement);

  static bool detect(const Environ& env);

  std::string name() const override { return "torchelastic"; }
  bool creates_processes_externally() const override { return true; }
  /// Number of workers torchrun started on this node (LOCAL_WORLD_SIZE).
  int local_world_size() const { return placement_.local_world_size; }

  /// LOCAL_WORLD_SIZE must equal `devices` and WORLD_SIZE must equal devices * num_nodes;
  /// otherwise EnvironmentError saying which --devices / --num-nodes to use.
  void validate_settings(int devices, int num_nodes) const override;
};

}  // namespace environments
}  // namespace lockstep
