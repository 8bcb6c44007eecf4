#pragma once
/// SLURMEnvironment: tasks started by srun; plus SLURM hostlist expansion.

#include <optional>
#include <string>
#include <vector>

#include <lockstep/environments/cluster_environment.h>

namespace lockstep {
namespace environments {

/// The environment of a task that srun started. Detected when SLURM_NTASKS is set and
/// SLURM_JOB_NAME is neither "bash" nor "interactive" (an interactive allocation is left to
/// another environment, as in Lightning: use `srun --job-name=interactive` to opt out).
/// Values, read at construction:
///   world_size    SLURM_NTASKS
///   global_rank   SLURM_PROCID
///   local_rank    SLURM_LOCALID
///   node_rank     SLURM_NODEID
///   main_address  MASTER_ADDR, else the first host of SLURM_STEP_NODELIST, SLURM_NODELIST or
///                 SLURM_JOB_NODELIST (the first one set; the step's list first because srun
///                 places task 0 on the first node of its step); "127.0.0.1" when none is set
///                 and the job has one node
///   main_port     MASTER_PORT, else 15000 + the last 4 characters of SLURM_JOB_ID read as a
///                 number (Lightning's rule: job 4242 -> 19242, job 1234567 -> 19567), else 12910
/// Example: `srun --nodes=2 --ntasks-per-node=4 ./train --devices 4 --num-nodes 2`.
class SLURMEnvironment : public ClusterEnvironment {
 public:
  /// Throws EnvironmentError when a variable srun always sets is missing or invalid, or the
  /// node list is malformed.
  explicit SLURMEnvironment(const Environ& env);

  static bool detect(const Environ& env);
  /// True when SLURM_JOB_NAME is "bash" or "interactive".
  static bool is_interactive(const Environ& env);

  std::string name() const override { return "slurm"; }
  bool creates_processes_externally() const override { return true; }

  /// SLURM_NTASKS_PER_NODE (when set) must equal `devices`, SLURM_STEP_NUM_NODES (else
  /// SLURM_NNODES, when set) must equal `num_nodes`, and SLURM_NTASKS must equal
  /// devices * num_nodes; otherwise EnvironmentError naming the flag and the srun option that
  /// fix it.
  void validate_settings(int devices, int num_nodes) const override;

 private:
  std::optional<int> ntasks_per_node_;
  std::optional<int> nnodes_;
  std::optional<int> step_nnodes_;
};

/// Every host of a SLURM hostlist, in order: "node[01-03,7],gpu-a" -> node01 node02 node03
/// node7 gpu-a. Entries are separated by commas or spaces outside brackets; an entry may hold
/// several bracket groups ("r[1-2]n[1-2]" -> r1n1 r1n2 r2n1 r2n2); a range keeps the zero
/// padding of its lower bound. Throws EnvironmentError for malformed input: an unbalanced or
/// nested bracket, an empty entry or range, a non-numeric bound, a range whose lower bound
/// exceeds its upper (5-2), or more than 1,000,000 hosts.
std::vector<std::string> expand_slurm_nodelist(const std::string& nodelist);

/// The first host of a SLURM hostlist ("node[01-03,7],gpu-a" -> "node01") without expanding
/// the rest; the whole list is still checked, with the errors of expand_slurm_nodelist.
std::string first_slurm_host(const std::string& nodelist);

}  // namespace environments
}  // namespace lockstep
