#pragma once
// What CSVLogger and TensorBoardLogger share: the version directory, hparams.yaml, and
// replacing a small file atomically.

#include <mutex>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include <lockstep/loggers/logger_options.h>

namespace lockstep {
namespace loggers {
namespace detail {

/// `<root>/<name>/version_<N>`, resolved and created on first use (see LoggerOptions::version).
class RunDirectory {
 public:
  explicit RunDirectory(LoggerOptions options) : options_(std::move(options)) {}
  /// "version_<N>"; claims the directory the first time.
  std::string version() const;
  /// The full path of the version directory; claims it the first time.
  std::string path() const;

 private:
  std::string experiment_dir() const;
  std::string claim() const;

  LoggerOptions options_;
  // Guards version_: claimed once, on first use, by whichever thread asks first.
  mutable std::mutex mutex_;
  mutable std::optional<std::string> version_;
};

/// `params` as block-style YAML, the way PyYAML's safe_dump lays out a dict (keys in the
/// object's order; nested arrays of containers in flow style).
std::string to_yaml(const nlohmann::json& params);

/// Merges the object `params` into `merged` (later keys win) and writes `merged` to
/// `<dir>/hparams.yaml`. Throws UsageError when `params` is not a JSON object.
void write_hparams(const std::string& dir, const nlohmann::json& params, nlohmann::json& merged);

/// Replaces `path` with `text` through `<path>.tmp.<pid>` and rename, so readers see the old or
/// the new file, never a part. Throws IoError naming the file that failed.
void write_file_atomically(const std::string& path, const std::string& text);

}  // namespace detail
}  // namespace loggers
}  // namespace lockstep
