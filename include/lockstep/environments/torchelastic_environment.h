#pragma once
/// TorchElasticEnvironment: processes started by torchrun (or by Lockstep's own launcher,
/// which sets the same variables).

#include <string>

#include "lockstep/environments/cluster_environment.h"

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

  static bool detect(const Environ& env);

  std::string name() const override { return "torchelastic"; }
  bool creates_processes_externally() const override { return true; }
  std::string main_address() const override { return main_address_; }
  int main_port() const override { return main_port_; }
  int world_size() const override { return world_size_; }
  int global_rank() const override { return global_rank_; }
  int local_rank() const override { return local_rank_; }
  int node_rank() const override { return node_rank_; }
  bool use_agent_store() const override { return use_agent_store_; }
  int restart_count() const override { return restart_count_; }
  /// LOCKSTEP_STORE_FILE, which Lockstep's launchers set for a job on one machine.
  std::string store_file() const override { return store_file_; }
  /// Number of workers torchrun started on this node (LOCAL_WORLD_SIZE).
  int local_world_size() const { return local_world_size_; }

  /// LOCAL_WORLD_SIZE must equal `devices` and WORLD_SIZE must equal devices * num_nodes;
  /// otherwise EnvironmentError saying which --devices / --num-nodes to use.
  void validate_settings(int devices, int num_nodes) const override;

 private:
  std::string main_address_;
  int main_port_ = 0;
  int world_size_ = 0;
  int global_rank_ = 0;
  int local_rank_ = 0;
  int local_world_size_ = 0;
  int node_rank_ = 0;
  bool use_agent_store_ = false;
  int restart_count_ = 0;
  std::string store_file_;
};

}  // namespace environments
}  // namespace lockstep
