#pragma once
// CommThread: the sharded engine's collectives, one after another on a thread of their own, so
// that the next unit's all-gather and the last unit's reduce-scatter overlap the training
// thread's compute (not installed).

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <future>
#include <mutex>
#include <string>
#include <thread>

namespace lockstep {
namespace distributed {
namespace detail {

class CommThread {
 public:
  using Ticket = std::shared_future<void>;

  CommThread();
  /// Runs what is queued, then joins.
  ~CommThread();
  CommThread(const CommThread&) = delete;
  CommThread& operator=(const CommThread&) = delete;

  /// Queues `work` behind everything queued before. Once a work throws, later ones do not run:
  /// their tickets carry that first error, so that ranks out of step fail once, not per call.
  Ticket submit(std::function<void()> work);
  /// Waits for everything queued so far, at most `timeout`; rethrows the first error.
  void drain(std::chrono::milliseconds timeout, const std::string& who);

  /// Waits for `ticket`, at most `timeout`, and rethrows its work's exception. A DistributedError
  /// naming `who` and `what` when it does not complete in time.
  static void wait(const Ticket& ticket, std::chrono::milliseconds timeout, const std::string& who,
                   const std::string& what);

 private:
  void run();

  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::packaged_task<void()>> queue_;
  Ticket last_;
  std::exception_ptr failed_;  // the first error; later work is skipped
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace detail
}  // namespace distributed
}  // namespace lockstep
