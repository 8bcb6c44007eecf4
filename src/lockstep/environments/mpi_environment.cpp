#include "lockstep/environments/mpi_environment.h"

#include <string>

#include "lockstep/environments/slurm_environment.h"

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
  world_size_ = require(env, names, names.size);
  global_rank_ = require(env, names, names.rank);
  local_rank_ = require(env, names, names.local_rank);
  local_world_size_ = require(env, names, names.local_size);
  detail::check_positive(names.size, world_size_);
  detail::check_positive(names.local_size, local_world_size_);
  detail::check_rank_below(names.rank, global_rank_, names.size, world_size_);
  detail::check_rank_below(names.local_rank, local_rank_, names.local_size, local_world_size_);

  // rank / local size is the node's index only for equal, consecutive blocks of ranks per node.
  node_rank_ = global_rank_ / local_world_size_;
  if (world_size_ % local_world_size_ != 0 || global_rank_ % local_world_size_ != local_rank_) {
    throw EnvironmentError(
        std::string("Cannot tell this node's rank from the MPI placement: ") + names.rank + "=" +
        std::to_string(global_rank_) + ", " + names.local_rank + "=" +
        std::to_string(local_rank_) + ", " + names.local_size + "=" +
        std::to_string(local_world_size_) + ", " + names.size + "=" +
        std::to_string(world_size_) +
        ". Lockstep needs the same number of processes on every node, in consecutive blocks of "
        "ranks. Use " + names.per_node_option + " N with by-slot mapping (not --map-by node or "
        "round-robin placement).");
  }

  if (auto port = env.get("MASTER_PORT")) {
    main_port_ = detail::parse_port("MASTER_PORT", *port);
  } else {
    main_port_ = kDefaultPort;
  }

  if (auto address = env.get("MASTER_ADDR")) {
    main_address_ = *address;
  } else if (local_world_size_ == world_size_) {
    main_address_ = "127.0.0.1";
  } else if (auto list = env.get("SLURM_JOB_NODELIST")) {
    main_address_ = first_slurm_host(*list);
  } else {
    throw EnvironmentError(
        "MASTER_ADDR is not set and the MPI job spans " +
        std::to_string(world_size_ / local_world_size_) + " nodes (" + names.size + "=" +
        std::to_string(world_size_) + ", " + names.local_size + "=" +
        std::to_string(local_world_size_) +
        "): MPI launchers do not tell a process where rank 0 runs. Pass the host of rank 0, "
        "e.g. mpirun -x MASTER_ADDR=node01 (Open MPI) or mpiexec -genv MASTER_ADDR node01 "
        "(MPICH).");
  }
}

void MPIEnvironment::validate_settings(int devices, int num_nodes) const {
  const Names& names = flavor_ == kOpenMPI.flavor ? kOpenMPI : kMPICH;
  if (local_world_size_ != devices) {
    throw EnvironmentError("You set --devices=" + std::to_string(devices) + " but " +
                           names.launcher + " started " + names.local_size + "=" +
                           std::to_string(local_world_size_) +
                           " processes on this node. Use --devices " +
                           std::to_string(local_world_size_) + ", or " + names.per_node_option +
                           " " + std::to_string(devices) + ".");
  }
  if (world_size_ != devices * num_nodes) {
    std::string nodes = std::to_string(world_size_ / local_world_size_);
    throw EnvironmentError("You set --num-nodes=" + std::to_string(num_nodes) + " but " +
                           names.size + "=" + std::to_string(world_size_) + " with " +
                           std::to_string(local_world_size_) + " per node means " + nodes +
                           " nodes. Use --num-nodes " + nodes + ", or start " +
                           std::to_string(devices * num_nodes) + " processes (mpirun -np " +
                           std::to_string(devices * num_nodes) + ").");
  }
}

}  // namespace environments
}  // namespace lockstep
