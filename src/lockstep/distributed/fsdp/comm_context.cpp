#include "comm_context.h"

#include <exception>

#include <lockstep/distributed/distributed_error.h>

namespace lockstep {
namespace distributed {
namespace detail {

void CommContext::wait(const CommThread::Ticket& ticket, const std::string& what) {
  try {
    CommThread::wait(ticket, group.timeout() * 2, group.describe(), what);
  } catch (const std::exception& e) {
    fail(e.what());
  }
}

void CommContext::drain() {
  try {
    thread->drain(group.timeout() * 2, group.describe());
  } catch (const std::exception& e) {
    fail(e.what());
  }
}

void CommContext::record(const std::function<void(CommTimes&)>& change) {
  std::lock_guard<std::mutex> lock(times_mutex_);
  change(times_);
}

CommContext::CommTimes CommContext::times() const {
  std::lock_guard<std::mutex> lock(times_mutex_);
  return times_;
}

void CommContext::reset_times() {
  std::lock_guard<std::mutex> lock(times_mutex_);
  times_ = CommTimes();
}

void CommContext::fail(const std::string& message) {
  failure_ = message;
  throw DistributedError(message);
}

void CommContext::throw_if_failed() const {
  if (!failure_.empty()) throw DistributedError(failure_);
}

}  // namespace detail
}  // namespace distributed
}  // namespace lockstep
