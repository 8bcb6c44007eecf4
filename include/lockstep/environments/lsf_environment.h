#pragma once
/// LSFEnvironment: tasks started by jsrun in an IBM Spectrum LSF job.

#include <optional>
#include <string>
#include <vector>

#include <lockstep/environments/cluster_environment.h>

namespace lockstep {
namespace environments {

/// The environment of a task that jsrun started in an LSF job. Detected when LSB_JOBID,
/// LSB_DJOB_RANKFILE, JSM_NAMESPACE_LOCAL_RANK and JSM_NAMESPACE_SIZE are set (Lightning's
/// rule); JSM_NAMESPACE_RANK is then required too. Values, read at construction:
///   world_size    JSM_NAMESPACE_SIZE
///   global_rank   JSM_NAMESPACE_RANK
///   local_rank    JSM_NAMESPACE_LOCAL_RANK
///   node_rank     index of this host among the distinct compute hosts of the rank file
///   main_address  MASTER_ADDR, else the first compute host of the rank file
///   main_port     MASTER_PORT, else 10000 + LSB_JOBID % 1000 (Lightning's rule)
/// The rank file (LSB_DJOB_RANKFILE) holds one host name per line; its first line is the launch
/// node, which runs no task and is skipped. Host names match exactly or by their short name
/// (the part before the first '.'), so "node1" matches "node1.cluster.org".
/// Example: `bsub -nnodes 2 jsrun -n 8 -r 4 -a 1 -g 1 ./train --devices 4 --num-nodes 2`.
class LSFEnvironment : public ClusterEnvironment {
 public:
  /// `hostname` is this machine's name; by default gethostname(). (Not $HOSTNAME: jsrun copies
  /// the launch node's environment, so $HOSTNAME can name another machine.) Throws
  /// EnvironmentError for missing or invalid variables, an unreadable or empty rank file (the
  /// message names the path), or a host that is not in the rank file.
  explicit LSFEnvironment(const Environ& env, std::optional<std::string> hostname = std::nullopt);

  static bool detect(const Environ& env);

  std::string name() const override { return "lsf"; }
  bool creates_processes_externally() const override { return true; }
  /// The distinct compute hosts of the rank file, in order of first appearance.
  const std::vector<std::string>& hosts() const { return hosts_; }

  /// The world size must equal devices * num_nodes; otherwise EnvironmentError naming
  /// --devices / --num-nodes and the jsrun options to use. (The node count is not checked: the
  /// rank file lists the whole allocation, of which jsrun may use a part.)
  void validate_settings(int devices, int num_nodes) const override;

 private:
  std::vector<std::string> hosts_;
};

/// The compute hosts of an LSF rank file, one entry per line as written (blank lines dropped),
/// without the first line (the launch node). Throws EnvironmentError naming `path` when the file
/// cannot be read or lists no compute host.
std::vector<std::string> read_lsf_rankfile(const std::string& path);

}  // namespace environments
}  // namespace lockstep
