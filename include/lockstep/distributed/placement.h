#pragma once
/// Placement: where one process sits in a job and how it reaches rank 0. Cluster environments
/// read it from a scheduler's variables; launchers hand it to each process they start.

#include <string>

namespace lockstep {
namespace distributed {

struct Placement {
  int world_size = 1;
  int global_rank = 0;
  int local_rank = 0;
  /// Processes of this job on this node; 0 where the scheduler does not say.
  int local_world_size = 0;
  int node_rank = 0;
  std::string main_address = "127.0.0.1";
  int main_port = 0;
  /// The launcher's agent hosts the store at main_address:main_port (torchrun's static
  /// rendezvous), so every rank joins it as a client.
  bool use_agent_store = false;
  /// Restarts of the workers so far; with use_agent_store each attempt meets under its own keys.
  int restart_count = 0;
  /// The rendezvous file of a job on one machine (ProcessGroupOptions::store_file), or "".
  std::string store_file;
};

}  // namespace distributed
}  // namespace lockstep
