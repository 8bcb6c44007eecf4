#pragma once
// A user's own ClusterEnvironment (Lightning's plugins=[MyClusterEnvironment()]): a scheduler
// that Lockstep does not detect, which started every process.

#include <memory>
#include <string>

#include <lockstep/environments/cluster_environment.h>

namespace lockstep {
namespace testing {

class SchedulerEnvironment : public environments::ClusterEnvironment {
 public:
  explicit SchedulerEnvironment(const distributed::Placement& placement, bool starts_processes = true)
      : starts_processes_(starts_processes) {
    placement_ = placement;
  }
  std::string name() const override { return "my_scheduler"; }
  bool creates_processes_externally() const override { return starts_processes_; }

 private:
  bool starts_processes_;
};

// Rank `rank` of `world` processes, `per_node` on each node, rank 0 at `address`:`port`.
inline std::shared_ptr<SchedulerEnvironment> scheduler_environment(int rank, int world, int per_node,
                                                                   const std::string& address, int port) {
  distributed::Placement placement;
  placement.world_size = world;
  placement.global_rank = rank;
  placement.local_world_size = per_node;
  placement.local_rank = rank % per_node;
  placement.node_rank = rank / per_node;
  placement.main_address = address;
  placement.main_port = port;
  return std::make_shared<SchedulerEnvironment>(placement);
}

}  // namespace testing
}  // namespace lockstep
