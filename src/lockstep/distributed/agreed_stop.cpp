#include <lockstep/distributed/agreed_stop.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <sstream>
#include <thread>

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
    case SIGINT: return "SIGINT (Ctrl-C)";
    default: return "signal " + std::to_string(signal);
  }
}

std::vector<uint8_t> bytes(const std::string& text) { return {text.begin(), text.end()}; }
std::string text(const std::vector<uint8_t>& bytes) { return {bytes.begin(), bytes.end()}; }

}  // namespace

struct AgreedStop::Shared {
  std::shared_ptr<ProcessGroup> group;
  std::string prefix;                    // this AgreedStop's keys in the group's store
  std::atomic<bool> known{false};        // a request exists (this rank's or another's)
  std::atomic<bool> published{false};    // this rank wrote its request
  std::atomic<bool> acknowledged{false}; // this rank counted itself among those who know
  std::atomic<int64_t> last_step{0};     // the last step at_step saw
  std::mutex mutex;
  std::condition_variable wake;
  bool quit = false;
  bool watching = true;
  std::optional<StopRequest> local;      // the request without a group

  std::string key(const std::string& name) const { return prefix + name; }

  void publish(int signal, const std::string& reason) {
    if (published.exchange(true)) return;
    if (!group) {
      std::lock_guard<std::mutex> lock(mutex);
      local = StopRequest{signal, 0, reason};
    } else {
      if (group->store()->add(key("requests"), 1) == 1) {
        // The first request of the job is the one every rank reports.
        group->store()->set(key("reason"), bytes(std::to_string(signal) + " " + std::to_string(group->rank()) + " " + reason));
      }
      acknowledge();
    }
    known = true;
  }

  void publish_signal() {
    const int signal = caught.load();
    if (signal == 0 || published) return;
    const std::string who = group ? "rank " + std::to_string(group->rank()) : "the process";
    publish(signal, signal_name(signal) + " reached " + who + " after step " + std::to_string(last_step.load()));
  }

  void acknowledge() {
    if (!acknowledged.exchange(true)) group->store()->add(key("known"), 1);
  }

  // Not needed for agreement, only for a prompt stop: the other ranks learn of the request from
  // their watchers, and might otherwise train on for a while. Bounded: a rank whose watcher is
  // slow (its store busy) is not waited for.
  void wait_until_all_know() {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (group->store()->add(key("known"), 0) < group->world_size() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

  void watch() {
    std::unique_lock<std::mutex> lock(mutex);
    // 50 ms, slower for large jobs: the store answers every rank's poll (about 500 a second at most).
    const auto interval = std::chrono::milliseconds(std::max(50, 2 * (group ? group->world_size() : 1)));
    while (!quit && !known) {
      wake.wait_for(lock, interval);
      if (quit) break;
      lock.unlock();
      try {
        publish_signal();
        if (group && group->store()->check({key("reason")})) {
          acknowledge();
          known = true;
        }
      } catch (const std::exception&) {
        // The store went away: the job is ending, and the training thread's own calls say why.
        lock.lock();
        break;
      }
      lock.lock();
    }
    watching = false;
    wake.notify_all();
  }
};

AgreedStop::AgreedStop(std::shared_ptr<ProcessGroup> group, const std::vector<int>& signals)
    : shared_(std::make_shared<Shared>()) {
  shared_->group = std::move(group);
  // Every rank makes its AgreedStops in the same order: the count names this one's keys.
  if (shared_->group) {
    shared_->prefix = "agreed_stop/" + std::to_string(shared_->group->next_barrier_generation("agreed_stop")) + "/";
  }
  caught.store(0);
  for (int signal : signals) {
    // A signal the process ignores (SIGINT for a job started in the background with `&`) stays
    // ignored, as Python leaves it.
    struct sigaction current {};
    if (::sigaction(signal, nullptr, &current) != 0 || current.sa_handler == SIG_IGN) continue;
    struct sigaction action {};
    action.sa_handler = record_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    struct sigaction previous {};
    if (::sigaction(signal, &action, &previous) == 0) previous_.emplace_back(signal, previous);
  }
  std::thread([shared = shared_] { shared->watch(); }).detach();
}

AgreedStop::~AgreedStop() {
  for (const auto& [signal, previous] : previous_) ::sigaction(signal, &previous, nullptr);
  std::unique_lock<std::mutex> lock(shared_->mutex);
  shared_->quit = true;
  shared_->wake.notify_all();
  // Normally at once; a watcher inside a store call that waits (FileStore retries a removed file
  // until its timeout) is left to finish on its own.
  shared_->wake.wait_for(lock, std::chrono::milliseconds(500), [&] { return !shared_->watching; });
}

void AgreedStop::request(const std::string& reason) { shared_->publish(0, reason); }

std::optional<StopRequest> AgreedStop::at_step(int64_t step) {
  auto& s = *shared_;
  s.last_step = step;
  if (caught.load() != 0 && !s.published) s.publish_signal();
  if (!s.known) return std::nullopt;
  if (!s.group) {
    std::lock_guard<std::mutex> lock(s.mutex);
    return s.local;
  }
  auto& store = *s.group->store();
  if (!posted_) {
    if (s.published) s.wait_until_all_know();
    store.set(s.key("step/" + std::to_string(s.group->rank())), bytes(std::to_string(step)));
    posted_ = true;
  }
  if (stop_after_ < 0) {
    std::vector<std::string> posts;
    for (int r = 0; r < s.group->world_size(); ++r) posts.push_back(s.key("step/" + std::to_string(r)));
    if (!store.check(posts)) return std::nullopt;
    // Every rank knows; the last one posted at most one step before any other rank passes here.
    int64_t latest = 0;
    for (const auto& post : posts) latest = std::max<int64_t>(latest, std::stoll(text(store.get(post))));
    stop_after_ = latest + 1;
  }
  if (step > stop_after_) {
    throw DistributedError(s.group->describe() + ": the ranks agreed to stop after step " + std::to_string(stop_after_) +
                           " but this rank is at step " + std::to_string(step) +
                           ": its steps do not synchronise with the other ranks' (each step needs a collective, "
                           "such as DDP's gradient all-reduce).");
  }
  if (step < stop_after_) return std::nullopt;
  std::istringstream first(text(store.get(s.key("reason"))));
  StopRequest request;
  first >> request.signal >> request.rank;
  first.get();
  std::getline(first, request.reason);
  return request;
}

}  // namespace distributed
}  // namespace lockstep
