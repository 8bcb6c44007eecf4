#pragma once
/// Logger: where a run's metrics and hyperparameters go (Lightning's `Logger`). The Trainer calls
/// it on rank 0 only.

#include <cstdint>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

namespace lockstep {
namespace loggers {

/// A destination for metrics. Implement the four pure methods; `save` and `finalize` default to
/// doing nothing.
///   class PrintLogger : public Logger { ... log_metrics(m, step) { for (auto& [k, v] : m) ... } };
class Logger {
 public:
  virtual ~Logger() = default;

  /// Records `metrics` (name -> value) at global step `step`. An "epoch" entry is the epoch.
  virtual void log_metrics(const std::map<std::string, double>& metrics, int64_t step) = 0;
  /// Records the run's hyperparameters (a JSON object; later calls add to and overwrite keys).
  virtual void log_hyperparams(const nlohmann::json& params) = 0;
  /// Writes anything buffered to disk.
  virtual void save() {}
  /// Called once when the run ends: `status` is "success", "failed" or "interrupted".
  virtual void finalize(const std::string& status) { save(); }

  /// Experiment name ("lockstep_logs").
  virtual std::string name() const = 0;
  /// Version directory name ("version_0").
  virtual std::string version() const = 0;
  /// The directory holding every experiment.
  virtual std::string save_dir() const = 0;
  /// This run's directory: save_dir()/name()/version(). Checkpoints go under it by default.
  virtual std::string log_dir() const;
};

}  // namespace loggers
}  // namespace lockstep
