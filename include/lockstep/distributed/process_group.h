#pragma once
/// ProcessGroup: the ranks of a job, joined through a store, with a communication backend.
/// This is the one place that creates c10d objects; everything else goes through it.

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <c10/core/Device.h>
#include <c10/util/intrusive_ptr.h>

#include <lockstep/core/error.h>
#include <lockstep/core/libtorch_compat.h>
#include <lockstep/distributed/distributed_error.h>
#include <lockstep/distributed/process_group_options.h>

namespace c10d {
class ProcessGroup;
class Backend;
class Store;
}  // namespace c10d

namespace lockstep {
namespace distributed {

/// What runs the collectives of a group: LibTorch 1.x's c10d::ProcessGroup, 2.x's c10d::Backend.
using Backend = libtorch::Backend;

}  // namespace distributed
}  // namespace lockstep

namespace lockstep {
namespace distributed {

/// The ranks of one job (or of a subgroup of it) and their backend.
///
///   auto pg = ProcessGroup::init(ProcessGroupOptions(rank, 2).main_port(29500));
///   lockstep::distributed::all_reduce(*pg, grad);  // mean over ranks
namespace detail {
class LivenessWatch;
}  // namespace detail

class ProcessGroup {
 public:
  /// Rendezvous through a TCPStore hosted by rank 0 at main_address:main_port, then create the
  /// backend. With use_agent_store, every rank instead joins the store torchrun's agent hosts
  /// there, under a prefix of this rendezvous round's; with store_file, the ranks meet in that file
  /// and Gloo binds to loopback (a job on one machine). Fails with DistributedError after
  /// `timeout` if some rank (or the agent's store) never answers. Creating a group sets SIGPIPE
  /// to ignored when it has its default action (as Python does), so that a peer that went away
  /// is an error naming it rather than the death of this process; a handler of yours is kept.
  static std::shared_ptr<ProcessGroup> init(const ProcessGroupOptions& options);
  /// Join through an existing store (an in-memory c10d::HashStore for ranks running as threads
  /// in one process, in tests).
  static std::shared_ptr<ProcessGroup> init_with_store(const c10::intrusive_ptr<c10d::Store>& store,
                                                       const ProcessGroupOptions& options);

  /// A group of some ranks of this one, like torch.distributed.new_group: every rank of this
  /// group must call it with the same list, in the same order as other collectives. Returns
  /// nullptr on ranks that are not members.
  std::shared_ptr<ProcessGroup> new_subgroup(const std::vector<int>& ranks);

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  const std::string& backend_name() const { return backend_name_; }
  /// Where the backend needs the tensors of a collective: the rank's CUDA device for nccl (the
  /// collectives copy CPU tensors there and back), the CPU for gloo (which also takes CUDA ones).
  c10::Device device() const { return device_; }
  /// ProcessGroupOptions::check_collectives or LOCKSTEP_DISTRIBUTED_DEBUG=detail: collectives
  /// compare their calls across ranks first (subgroups inherit it).
  bool checks_collectives() const { return checks_collectives_; }
  /// The number of the next checked collective of this group: 1, 2, ...
  int64_t next_collective_number() { return ++collectives_checked_; }
  /// Global ranks of the members, in group-rank order.
  const std::vector<int>& global_ranks() const { return global_ranks_; }

  /// The c10d objects, for the reducer and collectives.
  const c10::intrusive_ptr<Backend>& backend() const { return backend_; }
  const c10::intrusive_ptr<c10d::Store>& store() const { return store_; }

  /// How many barriers of this name this rank has entered before (named barriers count their
  /// generations so that the same name can be used again).
  int64_t next_barrier_generation(const std::string& name) { return barrier_generations_[name]++; }

  /// "rank 1/4" (or "rank 1/2 of subgroup [2, 3]"), for messages.
  std::string describe() const;

  /// For a collective that stalls: the members on other hosts that do not answer on the network
  /// (hosts_answering, 1 s), as "ranks 2, 3 (10.0.0.2) do not answer on the network from here: a
  /// cut link, a host gone, or a firewall dropping packets", or "" when every host answers, or
  /// the group does not span hosts over Gloo. Gloo groups learn their members' addresses when
  /// they are created.
  std::string unreachable_members() const;

 private:
  ProcessGroup(c10::intrusive_ptr<c10d::Store> store, c10::intrusive_ptr<Backend> backend,
               int rank, int world_size, std::vector<int> global_ranks,
               std::chrono::milliseconds timeout, std::string backend_name, c10::Device device,
               std::string main_address, bool is_subgroup);

  // Starts the liveness watch of a world group made by init() (options.liveness_timeout).
  void watch_liveness(const c10::intrusive_ptr<c10d::Store>& store, const ProcessGroupOptions& options,
                      const std::string& store_name);

  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<Backend> backend_;
  int rank_;
  int world_size_;
  std::vector<int> global_ranks_;
  std::chrono::milliseconds timeout_;
  std::string backend_name_;
  c10::Device device_;
  std::string main_address_;
  bool is_subgroup_;
  int subgroups_created_ = 0;
  bool checks_collectives_ = false;
  int64_t collectives_checked_ = 0;
  std::map<std::string, int64_t> barrier_generations_;
  std::vector<std::string> host_addresses_;  // Gloo's address of each member, where the group spans hosts
  int main_port_ = 0;
  std::shared_ptr<detail::LivenessWatch> liveness_;  // last: stops first
};

/// The backends this build can create: {"gloo"}, and "nccl" where LibTorch was built with NCCL
/// (PyPI's 2.x CUDA wheels).
std::vector<std::string> available_backends();

}  // namespace distributed
}  // namespace lockstep
