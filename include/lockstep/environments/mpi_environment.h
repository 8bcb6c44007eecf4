#pragma once
/// MPIEnvironment: processes started by mpirun / mpiexec (Open MPI, MPICH, Intel MPI).

#include <string>

#include <lockstep/environments/cluster_environment.h>

namespace lockstep {
namespace environments {

/// The environment of a process that an MPI launcher started. Lockstep does not link MPI: it
/// reads the variables the launcher puts in every process's environment. Detected when
/// OMPI_COMM_WORLD_SIZE (Open MPI) or PMI_RANK / PMI_SIZE (MPICH and Intel MPI's Hydra) is set.
/// Values, read at construction:
///                 Open MPI                      MPICH / Intel MPI
///   world_size    OMPI_COMM_WORLD_SIZE          PMI_SIZE
///   global_rank   OMPI_COMM_WORLD_RANK          PMI_RANK
///   local_rank    OMPI_COMM_WORLD_LOCAL_RANK    MPI_LOCALRANKID
///   local size    OMPI_COMM_WORLD_LOCAL_SIZE    MPI_LOCALNRANKS
///   node_rank     global_rank / local size. OMPI_COMM_WORLD_NODE_RANK is not used: despite
///                 its name it is the process's rank on its node across all jobs, not the
///                 node's index. The division holds only when every node runs the same number
///                 of processes in consecutive rank blocks (mpirun's default by-slot mapping);
///                 other placements (--map-by node) are an EnvironmentError, not a wrong guess.
///   main_address  MASTER_ADDR. MPI launchers do not tell a process where rank 0 runs, so:
///                 when the job fits on this node (local size == world size), "127.0.0.1";
///                 else, inside a SLURM allocation, the first host of SLURM_JOB_NODELIST
///                 (mpirun places rank 0 on the allocation's first node); else EnvironmentError
///                 asking for `mpirun -x MASTER_ADDR=<host of rank 0>`.
///   main_port     MASTER_PORT, default 29500 (PyTorch's default port): every rank must agree
///                 on it without communicating, so it cannot be a random free port.
/// Half-set variables (PMI_RANK without PMI_SIZE, ...) are an EnvironmentError.
/// Example: `mpirun -np 8 -npernode 4 -x MASTER_ADDR=node01 ./train --devices 4 --num-nodes 2`.
class MPIEnvironment : public ClusterEnvironment {
 public:
  /// Throws EnvironmentError for missing, invalid or contradictory variables.
  explicit MPIEnvironment(const Environ& env);

  static bool detect(const Environ& env);

  std::string name() const override { return "mpi"; }
  bool creates_processes_externally() const override { return true; }
  /// Number of processes of this job on this node.
  int local_world_size() const { return placement_.local_world_size; }
  /// "openmpi" or "mpich" (MPICH, Intel MPI and other PMI launchers).
  const std::string& flavor() const { return flavor_; }

  /// The local size must equal `devices` and the world size devices * num_nodes; otherwise
  /// EnvironmentError naming --devices / --num-nodes and the mpirun option that fix it.
  void validate_settings(int devices, int num_nodes) const override;

 private:
  std::string flavor_;
};

}  // namespace environments
}  // namespace lockstep
