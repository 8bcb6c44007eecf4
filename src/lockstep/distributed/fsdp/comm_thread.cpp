#include "comm_thread.h"

#include <utility>

#include <lockstep/distributed/distributed_error.h>

namespace lockstep {
namespace distributed {
namespace detail {

CommThread::CommThread() : thread_([this] { run(); }) {}

CommThread::~CommThread() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  ready_.notify_all();
  thread_.join();
}

CommThread::Ticket CommThread::submit(std::function<void()> work) {
  std::packaged_task<void()> task([this, work = std::move(work)] {
    if (failed_) std::rethrow_exception(failed_);
    try {
      work();
    } catch (...) {
      failed_ = std::current_exception();
      throw;
    }
  });
  Ticket ticket = task.get_future().share();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(task));
    last_ = ticket;
  }
  ready_.notify_all();
  return ticket;
}

void CommThread::drain(std::chrono::milliseconds timeout, const std::string& who) {
  Ticket last;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    last = last_;
  }
  if (last.valid()) wait(last, timeout, who, "the queued all-gathers and reduce-scatters");
}

void CommThread::wait(const Ticket& ticket, std::chrono::milliseconds timeout, const std::string& who,
                      const std::string& what) {
  // The collectives themselves time out after the group's timeout; this bound only guards
  // against work that never started because the thread is stuck in an earlier one.
  if (ticket.wait_for(timeout) != std::future_status::ready) {
    throw DistributedError(who + ": FullyShardedDataParallel: " + what + " did not complete within " +
                           std::to_string(timeout.count()) +
                           " ms; a rank may have died or stopped training. Check the other ranks' logs, or raise "
                           "the process group's timeout.");
  }
  ticket.get();
}

void CommThread::run() {
  for (;;) {
    std::packaged_task<void()> task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      ready_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();  // an exception goes to the task's ticket
  }
}

}  // namespace detail
}  // namespace distributed
}  // namespace lockstep
