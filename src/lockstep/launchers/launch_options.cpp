#include <lockstep/launchers/launch_options.h>

#include <unistd.h>

#include <string>

#include <lockstep/launchers/launch_error.h>

namespace lockstep {
namespace launchers {

LaunchOptions::LaunchOptions() : run_id_("lockstep-" + std::to_string(::getpid())) {}

void LaunchOptions::validate() const {
  auto fail = [](const std::string& message) { throw LaunchError(message); };
  if (nproc_per_node_ < 1) {
    fail("nproc_per_node=" + std::to_string(nproc_per_node_) +
         " is not a number of worker processes: it must be at least 1. "
         "Use --nproc-per-node 1 or more (one per device).");
  }
  if (nnodes_ < 1) {
    fail("nnodes=" + std::to_string(nnodes_) + " is not a number of nodes: it must be at least 1. "
         "Use --nnodes 1 for a job on this machine only.");
  }
  if (node_rank_ < 0 || node_rank_ >= nnodes_) {
    fail("node_rank=" + std::to_string(node_rank_) + " but nnodes=" + std::to_string(nnodes_) +
         ": node ranks run from 0 to " + std::to_string(nnodes_ - 1) + ". Use --node-rank 0.." +
         std::to_string(nnodes_ - 1) + " (a different one on each node) or raise --nnodes.");
  }
  if (master_port_ < 0 || master_port_ > 65535) {
    fail("master_port=" + std::to_string(master_port_) +
         " is not a TCP port: it must be 1..65535, or 0 to pick a free one. "
         "Use e.g. --master-port 29500.");
  }
  if (master_port_ == 0 && nnodes_ > 1) {
    fail("master_port=0 (pick a free port) works on one node only, but nnodes=" +
         std::to_string(nnodes_) + ": every node must be told the same port. "
         "Use --master-port P with the same P on every node, e.g. --master-port 29500.");
  }
  if (max_restarts_ < 0) {
    fail("max_restarts=" + std::to_string(max_restarts_) +
         " is not a number of restarts: it must be 0 or more. "
         "Use --max-restarts 0 (never restart) or e.g. --max-restarts 3.");
  }
  if (max_restarts_ > 0 && nnodes_ > 1) {
    fail("max_restarts=" + std::to_string(max_restarts_) + " with nnodes=" + std::to_string(nnodes_) +
         ": restarts are for a job on one node (--nnodes 1) for now. Each node's launcher would "
         "restart its own workers, and the static rendezvous (MASTER_ADDR:MASTER_PORT) cannot "
         "re-form the job across nodes; that needs an elastic rendezvous. Use --max-restarts 0 "
         "with several nodes, or torchrun --rdzv_backend c10d.");
  }
  if (master_addr_.empty()) {
    fail("master_addr is empty: the workers need the address of the node that runs global "
         "rank 0. Use --master-addr HOST (127.0.0.1 on one node).");
  }
  if (run_id_.empty()) {
    fail("run_id is empty: it names the job (TORCHELASTIC_RUN_ID). "
         "Leave it unset for lockstep-<pid>, or give any non-empty name.");
  }
  if (grace_period_.count() < 0) {
    fail("grace_period=" + std::to_string(grace_period_.count()) +
         " ms is negative: it is the time between SIGTERM and SIGKILL. Use 0 or more, e.g. 5000.");
  }
  if (exit_timeout_.count() < 0) {
    fail("exit_timeout=" + std::to_string(exit_timeout_.count()) +
         " ms is negative: it bounds rank 0's wait for the other workers at exit. "
         "Use 0 or more, e.g. 60000.");
  }
}

}  // namespace launchers
}  // namespace lockstep
