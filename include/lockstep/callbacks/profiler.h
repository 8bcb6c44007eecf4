#pragma once
/// Profiler: where the Trainer reports how long each hook and loop phase took (Lightning's
/// Profiler). Implement two methods: record and summary.

#include <chrono>
#include <string>
#include <string_view>

namespace lockstep {

///   SimpleProfiler profiler;
///   {
///     auto timed = profiler.scope("training_step");   // recorded when `timed` goes out of scope
///     loss = module.training_step(batch, i);
///   }
///   std::cerr << profiler.summary();
class Profiler {
 public:
  /// Measures from construction to destruction (or stop()) and records it under `action`. With a
  /// null profiler it does nothing and reads no clock, so call sites cost nothing when profiling
  /// is off: `Profiler::Scope timed(trainer_profiler_or_null, "backward");`.
  class Scope {
   public:
    Scope(Profiler* profiler, std::string_view action) : profiler_(profiler) {
      if (profiler_ == nullptr) return;
      action_ = action;
      start_ = std::chrono::steady_clock::now();
    }
    Scope(Scope&& other) noexcept
        : profiler_(other.profiler_), action_(std::move(other.action_)), start_(other.start_) {
      other.profiler_ = nullptr;
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    Scope& operator=(Scope&&) = delete;
    ~Scope() { stop(); }
    /// Records now instead of at destruction; later calls do nothing.
    void stop() {
      if (profiler_ == nullptr) return;
      profiler_->record(action_, std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
      profiler_ = nullptr;
    }

   private:
    Profiler* profiler_;
    std::string action_;
    std::chrono::steady_clock::time_point start_;
  };

  virtual ~Profiler() = default;
  /// One call of `action` that took `seconds`. May be called from several threads.
  virtual void record(const std::string& action, double seconds) = 0;
  /// The report printed at the end of fit (rank 0, stderr).
  virtual std::string summary() const = 0;

  /// Times the enclosing block as `action`.
  Scope scope(std::string_view action) { return Scope(this, action); }
};

}  // namespace lockstep
