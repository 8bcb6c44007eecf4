#pragma once
/// LocalEnvironment: no scheduler; Lockstep starts the processes of this node itself.

#include <string>

#include <lockstep/environments/cluster_environment.h>

namespace lockstep {
namespace environments {

/// The environment when no scheduler started this process (a laptop, a workstation, an
/// interactive SLURM allocation). Lockstep's launcher starts the other local processes.
/// Values are read once, at construction:
///   main_address  MASTER_ADDR, default "127.0.0.1"
///   main_port     MASTER_PORT, default a free TCP port (bind port 0 on 127.0.0.1), found once
///   world_size    WORLD_SIZE, default 1
///   global_rank   RANK, default 0
///   local_rank    LOCAL_RANK, default 0
///   node_rank     NODE_RANK, else GROUP_RANK, default 0
/// Several nodes without a scheduler (Lightning's manual recipe): on every node set NODE_RANK,
/// MASTER_ADDR and MASTER_PORT (node 0's address and a free port there), optionally WORLD_SIZE
/// (all processes), and start the same command with --num-nodes N; each node starts its own
/// --devices ranks, global ranks NODE_RANK * devices + local rank.
/// Example:
///   LocalEnvironment env(Environ::from_process());
///   launcher.start(env.main_address(), env.main_port());
class LocalEnvironment : public ClusterEnvironment {
 public:
  /// Throws EnvironmentError for a variable that is not a non-negative integer or a rank that
  /// is not below its world size.
  explicit LocalEnvironment(const Environ& env);

  /// Always true: local is the environment of last resort.
  static bool detect(const Environ& /*env*/) { return true; }

  std::string name() const override { return "local"; }
  bool creates_processes_externally() const override { return false; }
  /// With NODE_RANK (the manual recipe), throws EnvironmentError for NODE_RANK not below
  /// num_nodes, MASTER_ADDR or MASTER_PORT unset on several nodes, or a WORLD_SIZE other than
  /// devices * num_nodes. Without it, nothing to check.
  void validate_settings(int devices, int num_nodes) const override;

 private:
  bool node_rank_given_ = false;
  bool world_size_given_ = false;
  bool main_given_ = false;  // MASTER_ADDR and MASTER_PORT
};

/// A TCP port that is free on 127.0.0.1 right now (the kernel's pick for port 0).
/// Throws EnvironmentError when no socket can be bound.
int find_free_port();

}  // namespace environments
}  // namespace lockstep
