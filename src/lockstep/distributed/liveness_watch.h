#pragma once
// Finding a rank that stopped answering (its host gone, its process frozen) within a bound of its
// own, however long the collective timeout is (not installed). Every rank bumps a counter in the
// store from a background thread; rank 0 watches every counter, the others watch rank 0's and
// rank 0's verdict. A slow rank still beats: its main thread may take any time over a step.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <c10/util/intrusive_ptr.h>

namespace c10d {
class Store;
}  // namespace c10d

namespace lockstep {
namespace distributed {
namespace detail {

class LivenessWatch {
 public:
  /// What a verdict does: prints `message` and ends the process with exit code 1, so that the
  /// job's launcher ends the other ranks (or torchrun's agent restarts them).
  static void end_process(const std::string& message);

  /// Starts beating and watching through `store`, which this object uses from its own threads
  /// only (its own connection, or a store that is safe to share between threads). `hosts`: each
  /// rank's address, or empty on one host. `who`: "rank 1/4". `store_name`: where the store
  /// lives, for the verdict when it stops answering ("rank 0's store at 10.0.0.1:29500").
  /// `on_lost` gets the verdict.
  LivenessWatch(c10::intrusive_ptr<c10d::Store> store, int rank, int world_size,
                std::chrono::milliseconds bound, std::vector<std::string> hosts, std::string who,
                std::string store_name, std::function<void(const std::string&)> on_lost = end_process);
  /// Marks this rank as gone on purpose (unless an exception is unwinding the stack: then the
  /// others find it silent) and stops the threads.
  ~LivenessWatch();

  LivenessWatch(const LivenessWatch&) = delete;
  LivenessWatch& operator=(const LivenessWatch&) = delete;

 private:
  struct State;
  std::shared_ptr<State> state_;
  std::thread beat_;
  std::thread monitor_;
};

}  // namespace detail
}  // namespace distributed
}  // namespace lockstep
