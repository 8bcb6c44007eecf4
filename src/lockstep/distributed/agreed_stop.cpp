#include <lockstep/distributed/agreed_stop.h>

#include <algorithm>
#include <chrono>
#include <sstream>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <lockstep/core/error.h>

namespace lockstep {
namespace distributed {
namespace {

// The handler only records the signal (async-signal-safe); the watcher thread and at_step act.
std::atomic<int> caught{0};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs a lock-free flag");

// A second signal while the first is being handled ends the process as the signal would have.
void record_signal(int signal) {
  if (caught.exchange(signal) == 0) return;
  std::signal(signal, SIG_DFL);
  std::raise(signal);
}

std::string signal_name(int signal) {
  switch (signal) {
    case SIGTERM: return "SIGTERM";
    case SIGUSR1: return "SIGUSR1";
    case SIGUSR2: return "SIGUSR2";
    case SIGINT: return "SIGINT";
    default: return "signal " + std::to_string(signal);
  }
}

std::vector<uint8_t> bytes(const std::string& text) { return {text.begin(), text.end()}; }
std::string text(const std::vector<uint8_t>& bytes) { return {bytes.begin(), bytes.end()}; }

}  // namespace

AgreedStop::AgreedStop(std::shared_ptr<ProcessGroup> group, const std::vector<int>& signals) : group_(std::move(group)) {
  // Every rank makes its AgreedStops in the same order: the count names this one's keys.
  if (group_) prefix_ = "agreed_stop/" + std::to_string(group_->next_barrier_generation("agreed_stop")) + "/";
  caught.store(0);
  for (int signal : signals) {
    struct sigaction action {};
    action.sa_handler = record_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    struct sigaction previous {};
    if (::sigaction(signal, &action, &previous) == 0) previous_.emplace_back(signal, previous);
  }
  watcher_ = std::thread([this] { watch(); });
}

AgreedStop::~AgreedStop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    quit_ = true;
  }
  wake_.notify_all();
  watcher_.join();
  for (const auto& [signal, previous] : previous_) ::sigaction(signal, &previous, nullptr);
}

std::string AgreedStop::key(const std::string& name) const { return prefix_ + name; }

void AgreedStop::publish(int signal, const std::string& reason) {
  if (published_.exchange(true)) return;
  if (!group_) {
    std::lock_guard<std::mutex> lock(mutex_);
    local_ = StopRequest{signal, 0, reason};
  } else {
    if (group_->store()->add(key("requests"), 1) == 1) {
      // The first request of the job is the one every rank reports.
      group_->store()->set(key("reason"), bytes(std::to_string(signal) + " " + std::to_string(group_->rank()) + " " + reason));
    }
    acknowledge();
  }
  known_ = true;
}

void AgreedStop::acknowledge() {
  if (!acknowledged_.exchange(true)) group_->store()->add(key("known"), 1);
}

void AgreedStop::wait_until_all_know() {
  // Not needed for agreement, only for a prompt stop: the other ranks learn of the request from
  // their watchers (within about 50 ms), and might otherwise train on for a while. Bounded: a
  // rank whose watcher is slow (its store busy) is not waited for.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (group_->store()->add(key("known"), 0) < group_->world_size() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

void AgreedStop::publish_signal() {
  const int signal = caught.load();
  if (signal == 0 || published_) return;
  const std::string who = group_ ? "rank " + std::to_string(group_->rank()) : "the process";
  publish(signal, signal_name(signal) + " reached " + who + " after step " + std::to_string(last_step_.load()));
}

void AgreedStop::request(const std::string& reason) { publish(0, reason); }

void AgreedStop::watch() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!quit_ && !known_) {
    // 50 ms, slower for large jobs: the store answers every rank's poll (about 500 a second at most).
    const int ranks = group_ ? group_->world_size() : 1;
    wake_.wait_for(lock, std::chrono::milliseconds(std::max(50, 2 * ranks)));
    if (quit_) break;
    lock.unlock();
    try {
      publish_signal();
      if (group_ && group_->store()->check({key("reason")})) {
        acknowledge();
        known_ = true;
      }
    } catch (const std::exception&) {
      // The store went away: the job is ending, and the training thread's own calls say why.
      lock.lock();
      break;
    }
    lock.lock();
  }
}

std::optional<StopRequest> AgreedStop::at_step(int64_t step) {
  last_step_ = step;
  if (caught.load() != 0 && !published_) publish_signal();
  if (!known_) return std::nullopt;
  if (!group_) {
    std::lock_guard<std::mutex> lock(mutex_);
    return local_;
  }
  auto& store = *group_->store();
  if (!posted_) {
    if (published_) wait_until_all_know();
    store.set(key("step/" + std::to_string(group_->rank())), bytes(std::to_string(step)));
    posted_ = true;
  }
  if (stop_after_ < 0) {
    std::vector<std::string> posts;
    for (int r = 0; r < group_->world_size(); ++r) posts.push_back(key("step/" + std::to_string(r)));
    if (!store.check(posts)) return std::nullopt;
    // Every rank knows; the last one posted at most one step before any other rank passes here.
    int64_t latest = 0;
    for (const auto& post : posts) latest = std::max<int64_t>(latest, std::stoll(text(store.get(post))));
    stop_after_ = latest + 1;
  }
  if (step > stop_after_) {
    throw DistributedError(group_->describe() + ": the ranks agreed to stop after step " + std::to_string(stop_after_) +
                           " but this rank is at step " + std::to_string(step) +
                           ": its steps do not synchronise with the other ranks' (each step needs a collective, "
                           "such as DDP's gradient all-reduce).");
  }
  if (step < stop_after_) return std::nullopt;
  std::istringstream first(text(store.get(key("reason"))));
  StopRequest request;
  first >> request.signal >> request.rank;
  first.get();
  std::getline(first, request.reason);
  return request;
}

}  // namespace distributed
}  // namespace lockstep
