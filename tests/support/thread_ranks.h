#pragma once
// Runs N ranks as threads of one process over an in-memory c10d::HashStore (as Gloo's own
// tests do), and rethrows the first rank's failure in the test thread.

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <lockstep/distributed/process_group.h>

namespace lockstep {
namespace testing {

/// Runs body(rank) for each rank on its own thread; rethrows the first failure after all joined.
inline void run_threads(int world_size, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  std::mutex mutex;
  std::exception_ptr failure;
  for (int rank = 0; rank < world_size; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        body(rank);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex);
        if (!failure) failure = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (failure) std::rethrow_exception(failure);
}

inline void run_ranks(int world_size, const std::function<void(distributed::ProcessGroup&)>& body,
                      std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  run_threads(world_size, [&](int rank) {
    auto group = distributed::ProcessGroup::init_with_store(
        store, distributed::ProcessGroupOptions(rank, world_size).timeout(timeout));
    body(*group);
  });
}

}  // namespace testing
}  // namespace lockstep
