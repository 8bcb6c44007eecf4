#pragma once
/// The ClusterEnvironment interface: where this process sits in the job (ranks, main address).

#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <lockstep/core/error.h>
#include <lockstep/distributed/placement.h>
#include <lockstep/environments/environment_error.h>
#include <lockstep/distributed/process_group_options.h>

namespace lockstep {
namespace environments {

/// A snapshot of environment variables. Production code reads the process's own
/// (`Environ::from_process()`); tests pass recorded fixtures.
class Environ {
 public:
  Environ() = default;
  explicit Environ(std::map<std::string, std::string> vars) : vars_(std::move(vars)) {}
  /// Every variable of the calling process, read once.
  static Environ from_process();
  /// Variables recorded with `env > FILE` (KEY=VALUE lines; a line that does not start a new
  /// KEY= continues the previous value, as `env` prints multi-line values). For tests and for
  /// diagnosing a user's job from its recorded environment. EnvironmentError if unreadable.
  static Environ from_env_file(const std::string& path);

  /// The value of `name`, or nullopt when it is unset (an empty value counts as set).
  std::optional<std::string> get(const std::string& name) const;
  /// The value of `name` as a non-negative int, or nullopt when it is unset.
  /// Throws EnvironmentError naming the variable and its value when it is not one ("RANK=abc").
  std::optional<int> get_int(const std::string& name) const;
  bool has(const std::string& name) const { return vars_.count(name) > 0; }
  const std::map<std::string, std::string>& vars() const { return vars_; }

 private:
  std::map<std::string, std::string> vars_;
};

/// Where this process sits in a job and how to reach rank 0.
/// Every implementation also has `static bool detect(const Environ&)`.
class ClusterEnvironment {
 public:
  virtual ~ClusterEnvironment() = default;
  /// Short name: "local", "torchelastic", "slurm", "mpi", "lsf", "kubeflow".
  virtual std::string name() const = 0;
  /// True when a scheduler (torchrun, srun, mpirun, ...) started every process already,
  /// so Lockstep must not launch any.
  virtual bool creates_processes_externally() const = 0;
  /// Where this process sits, as read at construction.
  const distributed::Placement& placement() const { return placement_; }
  const std::string& main_address() const { return placement_.main_address; }
  int main_port() const { return placement_.main_port; }
  int world_size() const { return placement_.world_size; }
  int global_rank() const { return placement_.global_rank; }
  int local_rank() const { return placement_.local_rank; }
  int node_rank() const { return placement_.node_rank; }
  /// See distributed::Placement: false, 0 and "" except where an environment says otherwise.
  bool use_agent_store() const { return placement_.use_agent_store; }
  int restart_count() const { return placement_.restart_count; }
  const std::string& store_file() const { return placement_.store_file; }
  /// What ProcessGroup::init needs to join this job's ranks: rank, world size, main address and
  /// port, and the launcher's store where it hosts one. Backend and timeout stay at their defaults.
  distributed::ProcessGroupOptions process_group_options() const;
  /// Throws EnvironmentError when the trainer's devices/num_nodes contradict the scheduler.
  virtual void validate_settings(int /*devices*/, int /*num_nodes*/) const {}
  /// One line for logs and `lockstep env`, e.g.
  /// "slurm: global rank 5 of 8, local rank 1, node rank 1, main node01:15042".
  std::string describe() const;

 protected:
  distributed::Placement placement_;  // filled by each environment's constructor
};

/// The environment that applies, in the documented order: torchelastic, slurm, lsf, mpi,
/// kubeflow, then local. Throws EnvironmentError for a half-set environment.
///
/// Order and conflict rules (see also docs/environments.md):
/// 1. torchelastic: RANK, GROUP_RANK, LOCAL_RANK and LOCAL_WORLD_SIZE are all set. It comes first
///    because torchrun is often run inside a SLURM allocation or a Kubeflow pod, whose variables
///    the workers inherit; torchrun's own are the ones that describe the worker. Lockstep's own
///    launcher sets the same variables in the processes it starts.
/// 2. slurm: SLURM_NTASKS is set and SLURM_JOB_NAME is not "bash" or "interactive" (an
///    interactive allocation is ignored, as in Lightning, so `salloc` + a plain run is local).
///    Exception: when an MPI launcher started this process inside the allocation
///    (OMPI_COMM_WORLD_SIZE from mpirun, or MPI_LOCALNRANKS from Hydra's mpiexec; srun sets
///    neither), the SLURM variables describe mpirun's own step, not the worker, and mpi wins.
///    The rule reads only variables that are the same on every rank, so all ranks agree.
/// 3. lsf: LSB_JOBID, LSB_DJOB_RANKFILE, JSM_NAMESPACE_LOCAL_RANK and JSM_NAMESPACE_SIZE are set
///    (jsrun; it also sets Open MPI's variables, so it must come before mpi).
/// 4. mpi: OMPI_COMM_WORLD_SIZE (Open MPI) or PMI_RANK / PMI_SIZE (MPICH, Intel MPI) is set.
/// 5. kubeflow: KUBERNETES_PORT, MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK are all set.
/// 6. local: nothing above applies. But when some of RANK, LOCAL_RANK, WORLD_SIZE, GROUP_RANK,
///    LOCAL_WORLD_SIZE are set and others are not, the environment is half-set: that is an
///    EnvironmentError naming the missing ones, never a guess. Except WORLD_SIZE with NODE_RANK
///    and none of the others: Lightning's manual multi-node recipe, local (LocalEnvironment).
/// A detected environment whose variables are invalid (not integers, rank >= world size, a
/// required one missing) throws EnvironmentError from its constructor; detection does not fall
/// through to the next environment.
std::unique_ptr<ClusterEnvironment> detect_environment(const Environ& env);

namespace detail {

/// `value` of variable `name` as a non-negative int; EnvironmentError naming both otherwise.
int parse_non_negative(const std::string& name, const std::string& value);
/// `value` of variable `name` as a TCP port in 1..65535; EnvironmentError otherwise.
int parse_port(const std::string& name, const std::string& value);
/// The value of a variable the scheduler always sets; when it is unset, EnvironmentError
/// "`name` is not set: `why_and_fix`".
int require_int(const Environ& env, const std::string& name, const std::string& why_and_fix);
/// Throws EnvironmentError unless 0 <= rank < size, e.g. "RANK=4 is not below WORLD_SIZE=4".
void check_rank_below(const std::string& rank_name, int rank, const std::string& size_name,
                      int size);
/// Throws EnvironmentError unless size >= 1.
void check_positive(const std::string& name, int size);

}  // namespace detail

}  // namespace environments
}  // namespace lockstep
