#pragma once
// CommContext: what the sharded units share with the root for their collectives (FSDP2's
// FSDPCommContext): the groups, the transport, the communication thread, the time spent in
// collectives, and the first failure, which every later call rethrows (not installed).

#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include <lockstep/distributed/comm/shard_transport.h>
#include <lockstep/distributed/fsdp/fully_sharded.h>
#include <lockstep/distributed/process_group.h>

#include "comm_thread.h"
#include "gather_pool.h"

namespace lockstep {
namespace distributed {
namespace detail {

class CommContext {
 public:
  using CommTimes = FullyShardedDataParallelBase::CommTimes;

  CommContext(ProcessGroup& group, ProcessGroup& shard_group, ProcessGroup* replica_group)
      : group(group), shard_group(shard_group), replica_group(replica_group) {}

  ProcessGroup& group;
  ProcessGroup& shard_group;    // group, or with HYBRID_SHARD this rank's subgroup
  ProcessGroup* replica_group;  // HYBRID_SHARD: the ranks holding the same shards; else null
  std::shared_ptr<ShardTransport> transport;  // chosen once the units' sizes are known
  std::unique_ptr<CommThread> thread = std::make_unique<CommThread>();
  GatherPool gathered;  // the memory of resharded units, for the next gathers

  /// Waits for `ticket`; a failure or a timeout goes through fail(). Each collective is bounded
  /// by the group's timeout; twice that covers one queued behind another.
  void wait(const CommThread::Ticket& ticket, const std::string& what);
  /// Waits for everything queued on the thread, as wait() does.
  void drain();

  /// Changes the times under their lock (the thread adds to them while the training thread reads).
  void record(const std::function<void(CommTimes&)>& change);
  CommTimes times() const;
  void reset_times();

  /// Keeps `message` as the engine's failure and throws it (DistributedError).
  [[noreturn]] void fail(const std::string& message);
  /// Rethrows a failure kept by fail() (a failure inside backward surfaces at the next call).
  void throw_if_failed() const;

 private:
  mutable std::mutex times_mutex_;
  CommTimes times_;
  std::string failure_;
};

}  // namespace detail
}  // namespace distributed
}  // namespace lockstep
