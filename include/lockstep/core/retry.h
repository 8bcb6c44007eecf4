#pragma once
/// Retrying with exponential backoff and full jitter (seed: Lightning's distrib_parts
/// `retry_jittered_backoff`, after https://aws.amazon.com/blogs/architecture/exponential-backoff-and-jitter/).

#include <cstdint>
#include <functional>

#include <torch/arg.h>

namespace lockstep {

/// How retry_jittered_backoff waits between tries.
///   retry_jittered_backoff<DeviceBusyError>(pick, BackoffOptions().retries(3));
struct BackoffOptions {
  /// Tries in all, the first included; the last failure is re-thrown. Default: 5.
  TORCH_ARG(int, retries) = 5;
  /// No wait is longer than this many seconds. Default: 1.0.
  TORCH_ARG(double, cap_delay) = 1.0;
  /// The wait after the first failure is at most this many seconds; it doubles per failure. Default: 0.01.
  TORCH_ARG(double, base_delay) = 0.01;
  /// Waits `seconds`. Default: std::this_thread::sleep_for (tests inject a recorder).
  TORCH_ARG(std::function<void(double)>, sleep) = nullptr;
  /// A uniform draw from [0, 1) that scales each wait. Default: a std::mt19937_64 seeded from
  /// std::random_device, so that processes probing together do not retry in step.
  TORCH_ARG(std::function<double()>, uniform) = nullptr;
};

namespace detail {
/// The wait after failure number `failure` (0-based): uniform * min(cap_delay, base_delay * 2^failure).
double backoff_delay(int failure, const BackoffOptions& options);
/// Sleeps backoff_delay(failure, options) with the options' sleep function.
void backoff_sleep(int failure, const BackoffOptions& options);
}  // namespace detail

/// Calls `fn` until it returns without throwing `Retryable`, at most `options.retries()` times,
/// waiting a jittered, exponentially growing delay (bounded by cap_delay) after each failure but
/// the last; the last failure is re-thrown. Other exceptions pass through at once.
/// (The seed's Python version skipped its sleep with a `continue`; this one waits.)
template <typename Retryable, typename Fn>
auto retry_jittered_backoff(Fn&& fn, const BackoffOptions& options = {}) -> decltype(fn()) {
  for (int failure = 0;; ++failure) {
    try {
      return fn();
    } catch (const Retryable&) {
      if (failure + 1 >= options.retries()) throw;
    }
    detail::backoff_sleep(failure, options);
  }
}

}  // namespace lockstep
