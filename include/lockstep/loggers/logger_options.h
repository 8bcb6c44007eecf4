#pragma once
/// LoggerOptions: where a logger writes, `<root_dir>/<name>/version_<N>/`, as in Lightning.

#include <cstdint>
#include <optional>
#include <string>

#include <torch/arg.h>

namespace lockstep {
namespace loggers {

/// Options shared by CSVLogger and TensorBoardLogger.
///   CSVLogger logger(LoggerOptions("runs").name("mnist").version(3));  // runs/mnist/version_3
struct LoggerOptions {
  /// The directory that holds every experiment (the Trainer's default_root_dir).
  explicit LoggerOptions(std::string root_dir) : root_dir_(std::move(root_dir)) {}

  /// Root directory; required.
  TORCH_ARG(std::string, root_dir);
  /// Experiment name, a directory under root_dir; "" puts the version directories directly in
  /// root_dir. Default "lockstep_logs".
  TORCH_ARG(std::string, name) = "lockstep_logs";
  /// Version number: its directory `version_<N>` is reused (metrics.csv is appended to, with
  /// its header kept). Default: none, meaning one more than the highest existing version_<N>
  /// (0 when there is none), claimed by creating its directory.
  TORCH_ARG(std::optional<int64_t>, version) = std::nullopt;
};

}  // namespace loggers
}  // namespace lockstep
