#pragma once
/// TensorBoardLogger: scalars to an event file `<root>/<name>/version_<N>/events.out.tfevents.*`
/// that TensorBoard reads (`tensorboard --logdir <root>`), hyperparameters to hparams.yaml.

#include <cstdio>
#include <memory>
#include <string>

#include <lockstep/loggers/logger.h>
#include <lockstep/loggers/logger_options.h>

namespace lockstep {
namespace loggers {

namespace detail {
class RunDirectory;
}  // namespace detail

/// The event file is a sequence of TFRecords (uint64 length, masked CRC32C of the length, the
/// bytes, masked CRC32C of the bytes), each an `Event` protocol buffer encoded by hand: first
/// `{wall_time, file_version: "brain.Event:2"}`, then one `{wall_time, step, summary}` per
/// log_metrics call with one `Summary.Value{tag, simple_value}` per metric (values are stored as
/// float32, as TensorBoard's scalars are). The file name is
/// `events.out.tfevents.<unix seconds>.<hostname>.<pid>.0`, as PyTorch's SummaryWriter names
/// it. Each event is flushed when log_metrics returns, so TensorBoard shows a run while it trains.
///   TensorBoardLogger logger(LoggerOptions("runs"));
///   logger.log_metrics({{"train_loss", 0.5}}, /*step=*/49);
class TensorBoardLogger : public Logger {
 public:
  explicit TensorBoardLogger(LoggerOptions options);
  ~TensorBoardLogger() override;

  void log_metrics(const std::map<std::string, double>& metrics, int64_t step) override;
  /// Merges `params` into the hyperparameters logged so far, rewrites hparams.yaml and, unless
  /// they are empty, writes them for TensorBoard's HParams tab: a "_hparams_/session_start_info"
  /// summary, numbers, bools and strings typed, nested names joined with "/", lists as JSON text.
  void log_hyperparams(const nlohmann::json& params) override;
  void save() override;
  /// Flushes and closes the event file.
  void finalize(const std::string& status) override;

  std::string name() const override;
  std::string version() const override;
  std::string save_dir() const override;
  std::string log_dir() const override;

  /// Path of the event file ("" until the first event is written).
  std::string event_file() const { return event_path_; }

 private:
  void open();
  void write_record(const std::string& bytes);

  LoggerOptions options_;
  std::unique_ptr<detail::RunDirectory> run_;
  std::FILE* file_ = nullptr;
  std::string event_path_;
  nlohmann::json hparams_ = nlohmann::json::object();
};

}  // namespace loggers
}  // namespace lockstep
