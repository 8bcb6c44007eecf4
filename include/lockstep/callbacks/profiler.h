#pragma once
/// Profiler: where the Trainer reports how long each hook and loop phase took (Lightning's
/// Profiler). Implement two methods: record and summary; a profiler that traces (PyTorchProfiler)
/// also opens a range per action (start) and learns the rank and the run's folder (setup).

#include <chrono>
#include <memory>
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
  /// What start() keeps open while a Scope times its action: a LibTorch record_function range.
  class Range {
   public:
    virtual ~Range() = default;
  };

  /// Measures from construction to destruction (or stop()) and records it under `action`. With a
  /// null profiler it does nothing and reads no clock, so call sites cost nothing when profiling
  /// is off: `Profiler::Scope timed(trainer_profiler_or_null, "backward");`.
  class Scope {
   public:
    Scope(Profiler* profiler, std::string_view action) : profiler_(profiler) {
      if (profiler_ == nullptr) return;
      action_ = action;
      range_ = profiler_->start(action_);
      start_ = std::chrono::steady_clock::now();
    }
    Scope(Scope&& other) noexcept
        : profiler_(other.profiler_), action_(std::move(other.action_)), range_(std::move(other.range_)),
          start_(other.start_) {
      other.profiler_ = nullptr;
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    Scope& operator=(Scope&&) = delete;
    ~Scope() { stop(); }
    /// Records now instead of at destruction; later calls do nothing.
    void stop() {
      if (profiler_ == nullptr) return;
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
      range_.reset();
      profiler_->record(action_, seconds);
      profiler_ = nullptr;
    }

   private:
    Profiler* profiler_;
    std::string action_;
    std::unique_ptr<Range> range_;
    std::chrono::steady_clock::time_point start_;
  };

  virtual ~Profiler() = default;
  /// One call of `action` that took `seconds`. May be called from several threads.
  virtual void record(const std::string& action, double seconds) = 0;
  /// The report printed at the end of fit (rank 0, stderr).
  virtual std::string summary() const = 0;

  /// Called as a Scope opens `action`, on the Scope's thread; what it returns lives until the
  /// Scope records, and closes on that thread. Default: nothing. PyTorchProfiler opens a LibTorch
  /// record_function range here, so that the operations the action runs nest under it.
  virtual std::unique_ptr<Range> start(const std::string& /*action*/) { return nullptr; }
  /// Called by the Trainer on every rank as `stage` ("fit") begins, with the process's global rank
  /// and the run's log directory (Lightning's Profiler.setup). Default: nothing.
  virtual void setup(const std::string& /*stage*/, int /*global_rank*/, const std::string& /*log_dir*/) {}
  /// Called on every rank as `stage` ends, also when an exception ends it; before summary() on
  /// rank 0. Default: nothing.
  virtual void teardown(const std::string& /*stage*/) {}

  /// Times the enclosing block as `action`.
  Scope scope(std::string_view action) { return Scope(this, action); }
};

}  // namespace lockstep
