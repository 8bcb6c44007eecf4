#pragma once
/// AgreedStop: every rank stops at the same step when any rank asks — because a signal reached it
/// (Ctrl-C's SIGINT, SIGTERM, SLURM's SIGUSR1) or because it found its loss not finite — at no
/// cost per step until then.
///
///   distributed::AgreedStop stop(group, {SIGTERM, SIGUSR1});
///   for (int64_t step = 1;; ++step) {
///     train_one_step();
///     if (auto why = stop.at_step(step)) { save(); break; }  // the same step on every rank
///   }
///
/// How: a request (a caught signal, or request()) is written to the group's store; a watcher
/// thread per rank polls the store every 50 ms (2 ms per rank beyond 25 ranks), and the asking
/// rank waits (up to 2 s) at its next step until every rank knows. Each rank, at the first step
/// where it knows of the request, posts that step; all stop after the largest posted step + 1,
/// which every rank reaches only after all have posted, as long as each step synchronises the
/// ranks (DDP's gradient all-reduce does). A rank that finds itself past the agreed step throws
/// DistributedError rather than drift.

#include <csignal>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <lockstep/distributed/process_group.h>

namespace lockstep {
namespace distributed {

/// Why the ranks stop: the first request of the job.
struct StopRequest {
  /// The signal that asked (SIGINT, SIGTERM, SIGUSR1), or 0 for request().
  int signal = 0;
  /// The rank that asked first.
  int rank = 0;
  /// Its words, e.g. "SIGTERM reached rank 1 at step 57" or "rank 1: the loss is nan at step 57".
  std::string reason;
};

class AgreedStop {
 public:
  /// Catches `signals` until destroyed (the previous handlers come back then; a second signal
  /// meanwhile ends the process as it would have without us). A signal the process ignores when
  /// this is made stays ignored. `group` may be null for one process: the stop is then at the
  /// step where the request is seen.
  AgreedStop(std::shared_ptr<ProcessGroup> group, const std::vector<int>& signals);
  ~AgreedStop();
  AgreedStop(const AgreedStop&) = delete;
  AgreedStop& operator=(const AgreedStop&) = delete;

  /// Asks every rank to stop, for `reason` (this rank's words). From the training thread.
  void request(const std::string& reason);

  /// Call after every step (the same count on every rank, 1, 2, ...). The request once every
  /// rank is to stop after this step; nullopt otherwise (an atomic load while nobody asked).
  std::optional<StopRequest> at_step(int64_t step);

 private:
  // What the watcher thread shares with the training thread. The thread holds it too: a watcher
  // stuck in the store (a rendezvous file already removed by a failing job) is left behind after
  // a short wait instead of holding up this process's exit.
  struct Shared;
  std::shared_ptr<Shared> shared_;
  std::vector<std::pair<int, struct sigaction>> previous_;
  bool posted_ = false;      // this rank posted the step where it knew
  int64_t stop_after_ = -1;  // the agreed step, once every rank posted
};

}  // namespace distributed
}  // namespace lockstep
