#pragma once
/// CSVLogger: metrics to `<root>/<name>/version_<N>/metrics.csv`, hyperparameters to
/// `hparams.yaml` beside it (Lightning's CSVLogger, the Trainer's default logger).

#include <memory>
#include <string>
#include <vector>

#include <lockstep/loggers/logger.h>
#include <lockstep/loggers/logger_options.h>

namespace lockstep {
namespace loggers {

namespace detail {
class RunDirectory;
}  // namespace detail

/// Writes one CSV row per log_metrics call: "step" first, "epoch" second once it has been
/// logged, then metric names in the order they first appeared; a metric absent from a row is an
/// empty cell. A metric name never seen before adds a column: the file is rewritten with the
/// wider header (to a temporary file renamed over it, so a crash leaves the old or the new file,
/// never half of one) and earlier rows get empty cells. Values are written in the shortest form
/// that reads back as the same double. Each row is on disk when log_metrics returns.
///
/// The version directory is claimed (created) on the first call that needs it (version(),
/// log_dir() or a log method), so construct a logger on rank 0 only.
///   CSVLogger logger(LoggerOptions("runs"));
///   logger.log_metrics({{"train_loss", 0.5}, {"epoch", 0}}, /*step=*/49);
///   // runs/lockstep_logs/version_0/metrics.csv:  step,epoch,train_loss\n49,0,0.5\n
class CSVLogger : public Logger {
 public:
  explicit CSVLogger(LoggerOptions options);
  ~CSVLogger() override;

  void log_metrics(const std::map<std::string, double>& metrics, int64_t step) override;
  /// Merges `params` into the hyperparameters logged so far and rewrites hparams.yaml.
  void log_hyperparams(const nlohmann::json& params) override;

  std::string name() const override;
  std::string version() const override;
  std::string save_dir() const override;
  std::string log_dir() const override;

  /// Path of metrics.csv.
  std::string metrics_file() const;

 private:
  void load_existing_header();
  void add_columns(const std::map<std::string, double>& metrics);

  LoggerOptions options_;
  std::unique_ptr<detail::RunDirectory> run_;
  std::vector<std::string> columns_;
  bool header_loaded_ = false;
  nlohmann::json hparams_ = nlohmann::json::object();
};

}  // namespace loggers
}  // namespace lockstep
