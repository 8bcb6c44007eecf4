#pragma once
/// LaunchOptions: how many worker processes to start on this node and how they find each other.

#include <chrono>
#include <map>
#include <string>

namespace lockstep {
namespace launchers {

/// Options of a launch, named as torchrun's flags are. Every setter returns `*this`:
/// ```
///   auto options = LaunchOptions().nproc_per_node(4).master_port(0);
///   options.validate();  // throws LaunchError
/// ```
class LaunchOptions {
 public:
  /// All defaults; run_id is "lockstep-<pid of the calling process>".
  LaunchOptions();

  /// Worker processes on this node. Default: 1.
  LaunchOptions& nproc_per_node(int value) { nproc_per_node_ = value; return *this; }
  /// Nodes (machines) in the job. Default: 1.
  LaunchOptions& nnodes(int value) { nnodes_ = value; return *this; }
  /// This node's rank, 0..nnodes-1. Default: 0.
  LaunchOptions& node_rank(int value) { node_rank_ = value; return *this; }
  /// Address of the node that hosts global rank 0. Default: "127.0.0.1".
  LaunchOptions& master_addr(std::string value) { master_addr_ = std::move(value); return *this; }
  /// Port of global rank 0's store; 0 picks a free port on this node (one node only). Default: 0.
  LaunchOptions& master_port(int value) { master_port_ = value; return *this; }
  /// Time a worker gets between SIGTERM and SIGKILL when the job goes down. Default: 5000 ms.
  LaunchOptions& grace_period(std::chrono::milliseconds value) { grace_period_ = value; return *this; }
  /// launch_and_supervise only: how many times all workers are started again after one fails,
  /// as torchrun's --max-restarts (one node only). Default: 0.
  LaunchOptions& max_restarts(int value) { max_restarts_ = value; return *this; }
  /// TORCHELASTIC_RUN_ID of the job. Default: "lockstep-<pid>".
  LaunchOptions& run_id(std::string value) { run_id_ = std::move(value); return *this; }
  /// Folder of the workers' error files (TORCHELASTIC_ERROR_FILE=<log_dir>/attempt_<restart>/
  /// <local rank>/error.json, written by Python's `@record`). Default: "" = a new private folder
  /// under $TMPDIR, made at launch (as torchrun does).
  LaunchOptions& log_dir(std::string value) { log_dir_ = std::move(value); return *this; }
  /// In-process launchers (subprocess, fork): how long local rank 0 waits at its exit for the
  /// other workers before terminating them. Default: 60000 ms.
  LaunchOptions& exit_timeout(std::chrono::milliseconds value) { exit_timeout_ = value; return *this; }
  /// A variable for every worker beyond the launcher's own (which win on a clash), e.g. the GPUs
  /// that rank 0 picked. Default: none.
  LaunchOptions& worker_variable(std::string name, std::string value) {
    worker_variables_[std::move(name)] = std::move(value);
    return *this;
  }

  int nproc_per_node() const { return nproc_per_node_; }
  int nnodes() const { return nnodes_; }
  int node_rank() const { return node_rank_; }
  const std::string& master_addr() const { return master_addr_; }
  int master_port() const { return master_port_; }
  std::chrono::milliseconds grace_period() const { return grace_period_; }
  int max_restarts() const { return max_restarts_; }
  const std::string& run_id() const { return run_id_; }
  const std::string& log_dir() const { return log_dir_; }
  std::chrono::milliseconds exit_timeout() const { return exit_timeout_; }
  const std::map<std::string, std::string>& worker_variables() const { return worker_variables_; }

  /// Workers in the whole job: nproc_per_node * nnodes.
  int world_size() const { return nproc_per_node_ * nnodes_; }

  /// Throws LaunchError naming the first wrong value, what was given and how to fix it:
  /// counts below 1, node_rank outside 0..nnodes-1, a port outside 0..65535, master_port 0 with
  /// nnodes > 1, an empty master_addr or run_id, negative durations, negative max_restarts or
  /// max_restarts with nnodes > 1.
  void validate() const;

 private:
  int nproc_per_node_ = 1;
  int nnodes_ = 1;
  int node_rank_ = 0;
  std::string master_addr_ = "127.0.0.1";
  int master_port_ = 0;
  std::chrono::milliseconds grace_period_{5000};
  int max_restarts_ = 0;
  std::string run_id_;
  std::string log_dir_;
  std::chrono::milliseconds exit_timeout_{60000};
  std::map<std::string, std::string> worker_variables_;
};

}  // namespace launchers
}  // namespace lockstep
