#include "liveness_watch.h"

#include <pthread.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <future>
#include <iostream>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "store_text.h"
#include "wait_for.h"

namespace lockstep {
namespace distributed {
namespace detail {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// A counter this high: the rank left on purpose (its group was destroyed), it is not lost.
constexpr int64_t kLeft = int64_t{1} << 40;
const std::string kVerdict = "lockstep/alive/lost";

std::string counter(int rank) { return "lockstep/alive/" + std::to_string(rank); }

}  // namespace

struct LivenessWatch::State {
  c10::intrusive_ptr<c10d::Store> store;
  int rank = 0;
  int world_size = 0;
  milliseconds bound{0};
  milliseconds period{0};
  std::vector<std::string> hosts;
  std::string who;
  std::string store_name;
  std::function<void(const std::string&)> on_lost;

  std::mutex mutex;
  std::condition_variable wake;
  bool stopping = false;
  bool leave_on_stop = false;
  std::atomic<int64_t> last_answer{0};  // Clock ticks of the store's last answer
  std::atomic<bool> store_gone{false};  // an operation failed: the store closed, its process ended
  std::atomic<bool> judged{false};
  std::promise<void> beat_done, monitor_done;
  std::future<void> beat_finished, monitor_finished;

  // Sleeps a period; true when the watch is stopping.
  bool sleep() {
    std::unique_lock<std::mutex> lock(mutex);
    return wake.wait_for(lock, period, [this] { return stopping; });
  }
  std::string rank_name(int r) const {
    return "rank " + std::to_string(r) + (hosts.empty() ? "" : " (" + hosts[r] + ")");
  }
  std::string silence_of(int r) const {
    return rank_name(r) + " stopped answering: no heartbeat for " + seconds(bound) + " (liveness timeout " +
           seconds(bound) + ")";
  }
  void judge(const std::string& what) {
    if (judged.exchange(true)) return;
    on_lost(who + ": " + what + ". Its host may be gone or its process frozen; this rank ends (exit code 1) so "
            "that the job stops, or its launcher restarts it (torchrun --max-restarts, with --ckpt-path last).");
  }
  void beat();
  void monitor();
};

void LivenessWatch::State::beat() {
  std::vector<int64_t> seen(world_size, -1);
  std::vector<Clock::time_point> changed(world_size, Clock::now());
  // Whether rank r's counter has not moved for the bound (and it did not leave on purpose).
  auto silent = [&](int r) {
    const int64_t value = store->add(counter(r), 0);
    if (value != seen[r]) seen[r] = value, changed[r] = Clock::now();
    return value < kLeft && Clock::now() - changed[r] > bound;
  };
  try {
    do {
      store->add(counter(rank), 1);
      if (rank == 0) {
        for (int r = 1; r < world_size; ++r) {
          if (!silent(r)) continue;
          const std::string what = silence_of(r);
          store->set(kVerdict, bytes_of(what));
          std::this_thread::sleep_for(period * 3 / 2);  // the others read the verdict before the store ends
          judge(what);
          return;
        }
      } else if (store->check({kVerdict})) {
        const auto what = store->get(kVerdict);
        judge("rank 0 found that " + text_of(what));
        return;
      } else if (silent(0)) {
        judge(silence_of(0));
        return;
      } else if (seen[0] >= kLeft) {
        return;  // rank 0 left on purpose: nobody watches any more
      }
      last_answer = Clock::now().time_since_epoch().count();
    } while (!sleep());
    if (leave_on_stop) store->add(counter(rank), kLeft);
  } catch (const std::exception&) {
    // The store closed its connection: its process ended (the job is ending, or it crashed and
    // the collectives say so). Only a store that stops answering is a verdict.
    store_gone = true;
  }
}

void LivenessWatch::State::monitor() {
  while (!sleep()) {
    if (store_gone || judged) return;
    const auto since = Clock::now() - Clock::time_point(Clock::duration(last_answer.load()));
    if (since > bound + period) {
      judge(store_name + " stopped answering for " +
            seconds(std::chrono::duration_cast<milliseconds>(since)) + " (liveness timeout " + seconds(bound) + ")");
      return;
    }
  }
}

void LivenessWatch::end_process(const std::string& message) {
  std::cerr << message << std::endl;
  std::fflush(nullptr);
  std::_Exit(1);
}

LivenessWatch::LivenessWatch(c10::intrusive_ptr<c10d::Store> store, int rank, int world_size, milliseconds bound,
                             std::vector<std::string> hosts, std::string who, std::string store_name,
                             std::function<void(const std::string&)> on_lost)
    : state_(std::make_shared<State>()) {
  state_->store = std::move(store);
  state_->rank = rank;
  state_->world_size = world_size;
  state_->bound = bound;
  state_->period = std::max(milliseconds(50), bound / 6);
  state_->hosts = std::move(hosts);
  state_->who = std::move(who);
  state_->store_name = std::move(store_name);
  state_->on_lost = std::move(on_lost);
  state_->last_answer = Clock::now().time_since_epoch().count();
  state_->beat_finished = state_->beat_done.get_future();
  state_->monitor_finished = state_->monitor_done.get_future();
  // Each thread holds the state: one stuck in a store call is left behind, not waited for.
  // Named, so that top -H and bench_ddp (its liveness_cpu_share) find them.
  beat_ = std::thread([state = state_] {
    ::pthread_setname_np(::pthread_self(), "ls-alive-beat");
    state->beat();
    state->beat_done.set_value();
  });
  monitor_ = std::thread([state = state_] {
    ::pthread_setname_np(::pthread_self(), "ls-alive-watch");
    state->monitor();
    state->monitor_done.set_value();
  });
}

LivenessWatch::~LivenessWatch() {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stopping = true;
    state_->leave_on_stop = std::uncaught_exceptions() == 0;
  }
  state_->wake.notify_all();
  const auto deadline = Clock::now() + std::chrono::seconds(2);
  for (auto [thread, finished] : {std::make_pair(&beat_, &state_->beat_finished),
                                   std::make_pair(&monitor_, &state_->monitor_finished)}) {
    if (finished->wait_until(deadline) == std::future_status::ready) {
      thread->join();
    } else {
      thread->detach();
    }
  }
}

}  // namespace detail
}  // namespace distributed
}  // namespace lockstep
