#include <lockstep/environments/mpi_environment.h>

#include <string>

#include <lockstep/environments/slurm_environment.h>

namespace lockstep {
namespace environments {
namespace {

// The names one MPI implementation's launcher uses for the four numbers Lockstep needs.
struct Names {
  const char* flavor;
  const char* size;
  const char* rank;
  const char* local_rank;
  const char* local_size;
  const char* launcher;        // for messages
  const char* per_node_option;  // the launcher option that sets processes per node
};

const Names kOpenMPI = {"openmpi",
                        "OMPI_COMM_WORLD_SIZE",
                        "OMPI_COMM_WORLD_RANK",
                        "OMPI_COMM_WORLD_LOCAL_RANK",
                        "OMPI_COMM_WORLD_LOCAL_SIZE",
                        "Open MPI's mpirun",
                        "mpirun -npernode"};
const Names kMPICH = {"mpich",          "PMI_SIZE",          "PMI_RANK",
                      "MPI_LOCALRANKID", "MPI_LOCALNRANKS",   "mpiexec (MPICH / Intel MPI)",
                      "mpiexec -ppn"};

constexpr int kDefaultPort = 29500;

int require(const Environ& env, const Names& names, const char* variable) {
  return detail::require_int(
      env, variable,
      std::string(names.launcher) + " sets " + names.size + ", " + names.rank + ", " +
          names.local_rank + " and " + names.local_size +
          " together in every process. Start the program with it (mpirun -np N ./train), or "
          "unset the ones that are set.");
}

// Open MPI's names are specific to its launcher; PMI_* are shared by several launchers.
const Names& names_for(const Environ& env) {
  return env.has(kOpenMPI.size) || env.has(kOpenMPI.rank) ? kOpenMPI : kMPICH;
}

}  // namespace

bool MPIEnvironment::detect(const Environ& env) {
  return env.has(kOpenMPI.size) || env.has(kOpenMPI.rank) || env.has(kMPICH.rank) ||
         env.has(kMPICH.size);
}

MPIEnvironment::MPIEnvironment(const Environ& env) {
  const Names& names = names_for(env);
  flavor_ = names.flavor;
  placement_.world_size = require(env, names, names.size);
  placement_.global_rank = require(env, names, names.rank);
  placement_.local_rank = require(env, names, names.local_rank);
  placement_.local_world_size = require(env, names, names.local_size);
  detail::check_positive(names.size, placement_.world_size);
  detail::check_positive(names.local_size, placement_.local_world_size);
  detail::check_rank_below(names.rank, placement_.global_rank, names.size, placement_.world_size);
  detail::check_rank_below(names.local_rank, placement_.local_rank, names.local_size, placement_.local_world_size);

  // rank / local size is the node's index only for equal, consecutive blocks of ranks per node.
  placement_.node_rank = placement_.global_rank / placement_.local_world_size;
  const auto& p = placement_;
  if (p.world_size % p.local_world_size != 0 || p.global_rank % p.local_world_size != p.local_rank) {
    throw EnvironmentError(
        std::string("Cannot tell this node's rank from the MPI placement: ") + names.rank + "=" +
        std::to_string(placement_.global_rank) + ", " + names.local_rank + "=" +
        std::to_string(placement_.local_rank) + ", " + names.local_size + "=" +
        std::to_string(placement_.local_world_size) + ", " + names.size + "=" +
        std::to_string(placement_.world_size) +
        ". Lockstep needs the same number of processes on every node, in consecutive blocks of "
        "ranks. Use " + names.per_node_option + " N with by-slot mapping (not --map-by node or "
        "round-robin placement).");
  }

  if (auto port = env.get("MASTER_PORT")) {
    placement_.main_port = detail::parse_port("MASTER_PORT", *port);
  } else {
    placement_.main_port = kDefaultPort;
  }

  if (auto address = env.get("MASTER_ADDR")) {
    placement_.main_address = *address;
  } else if (placement_.local_world_size == placement_.world_size) {
    placement_.main_address = "127.0.0.1";
  } else if (auto list = env.get("SLURM_JOB_NODELIST")) {
    placement_.main_address = first_slurm_host(*list);
  } else {
    throw EnvironmentError(
        "MASTER_ADDR is not set and the MPI job spans " +
        std::to_string(placement_.world_size / placement_.local_world_size) + " nodes (" + names.size + "=" +
        std::to_string(placement_.world_size) + ", " + names.local_size + "=" +
        std::to_string(placement_.local_world_size) +
        "): MPI launchers do not tell a process where rank 0 runs. Pass the host of rank 0, "
        "e.g. mpirun -x MASTER_ADDR=node01 (Open MPI) or mpiexec -genv MASTER_ADDR node01 "
        "(MPICH).");
  }
}

void MPIEnvironment::validate_settings(int devices, int num_nodes) const {
  const Names& names = flavor_ == kOpenMPI.flavor ? kOpenMPI : kMPICH;
  if (placement_.local_world_size != devices) {
    throw EnvironmentError("You set --devices=" + std::to_string(devices) + " but " +
                           names.launcher + " started " + names.local_size + "=" +
                           std::to_string(placement_.local_world_size) +
                           " processes on this node. Use --devices " +
                           std::to_string(placement_.local_world_size) + ", or " + names.per_node_option +
                           " " + std::to_string(devices) + ".");
  }
  if (placement_.world_size != devices * num_nodes) {
    std::string nodes = std::to_string(placement_.world_size / placement_.local_world_size);
    throw EnvironmentError("You set --num-nodes=" + std::to_string(num_nodes) + " but " +
                           names.size + "=" + std::to_string(placement_.world_size) + " with " +
                           std::to_string(placement_.local_world_size) + " per node means " + nodes +
                           " nodes. Use --num-nodes " + nodes + ", or start " +
                           std::to_string(devices * num_nodes) + " processes (mpirun -np " +
                           std::to_string(devices * num_nodes) + ").");
  }
}

}  // namespace environments
}  // namespace lockstep
