#include <lockstep/core/retry.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <mutex>
#include <random>
#include <thread>

namespace lockstep {
namespace detail {
namespace {

double default_uniform() {
  static std::mutex mutex;
  static std::mt19937_64 generator{std::random_device{}()};
  std::lock_guard<std::mutex> lock(mutex);
  return std::uniform_real_distribution<double>(0.0, 1.0)(generator);
}

}  // namespace

double backoff_delay(int failure, const BackoffOptions& options) {
  const double envelope = std::min(options.cap_delay(), options.base_delay() * std::ldexp(1.0, std::min(failure, 60)));
  const double draw = options.uniform() ? options.uniform()() : default_uniform();
  return std::clamp(draw, 0.0, 1.0) * std::max(envelope, 0.0);
}

void backoff_sleep(int failure, const BackoffOptions& options) {
  const double seconds = backoff_delay(failure, options);
  if (options.sleep()) {
    options.sleep()(seconds);
    return;
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
}

}  // namespace detail
}  // namespace lockstep
