#include <lockstep/loggers/csv_logger.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <cerrno>
#include <fstream>
#include <unordered_map>

#include <lockstep/core/error.h>

#include "run_directory.h"

namespace lockstep {
namespace loggers {
namespace {

std::string cell(const std::string& text) {
  if (text.find_first_of(",\"\n\r") == std::string::npos) return text;
  std::string quoted = "\"";
  for (char c : text) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
  return quoted + "\"";
}

std::vector<std::string> parse_line(const std::string& line) {
  std::vector<std::string> cells(1);
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted && c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
      cells.back() += '"';
      ++i;
    } else if (c == '"') {
      quoted = !quoted;
    } else if (c == ',' && !quoted) {
      cells.emplace_back();
    } else {
      cells.back() += c;
    }
  }
  return cells;
}

std::string join(const std::vector<std::string>& cells) {
  std::string line;
  for (size_t i = 0; i < cells.size(); ++i) line += (i ? "," : "") + cell(cells[i]);
  return line + "\n";
}

// The shortest text that reads back as the same double, like Python's repr ("0.1", "2", "nan").
std::string format(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return std::string(buffer, result.ptr);
}

// Rewrites `path` with header `columns`, moving each existing cell under its column's new place.
void rewrite(const std::string& path, const std::vector<std::string>& columns) {
  std::ifstream in(path);
  std::string line;
  std::string text = join(columns);
  if (std::getline(in, line)) {
    const auto old_columns = parse_line(line);
    std::unordered_map<std::string, size_t> position;
    for (size_t i = 0; i < columns.size(); ++i) position[columns[i]] = i;
    while (std::getline(in, line)) {
      const auto cells = parse_line(line);
      std::vector<std::string> row(columns.size());
      for (size_t i = 0; i < cells.size() && i < old_columns.size(); ++i) row[position.at(old_columns[i])] = cells[i];
      text += join(row);
    }
  }
  detail::write_file_atomically(path, text);
}

}  // namespace

CSVLogger::CSVLogger(LoggerOptions options)
    : options_(std::move(options)), run_(std::make_unique<detail::RunDirectory>(options_)) {}

CSVLogger::~CSVLogger() = default;

std::string CSVLogger::name() const { return options_.name(); }
std::string CSVLogger::version() const { return run_->version(); }
std::string CSVLogger::save_dir() const { return options_.root_dir(); }
std::string CSVLogger::log_dir() const { return run_->path(); }
std::string CSVLogger::metrics_file() const { return (std::filesystem::path(log_dir()) / "metrics.csv").string(); }

void CSVLogger::load_existing_header() {
  if (header_loaded_) return;
  header_loaded_ = true;
  std::ifstream in(metrics_file());
  std::string line;
  if (std::getline(in, line) && !line.empty()) columns_ = parse_line(line);
}

// "step" first, "epoch" second once logged, then the rest in the order they first appeared.
void CSVLogger::add_columns(const std::map<std::string, double>& metrics) {
  std::vector<std::string> others;
  bool has_epoch = metrics.count("epoch") > 0;
  for (const auto& column : columns_) {
    if (column == "epoch") has_epoch = true;
    if (column != "step" && column != "epoch") others.push_back(column);
  }
  for (const auto& [name, value] : metrics) {
    if (name != "step" && name != "epoch" && std::find(others.begin(), others.end(), name) == others.end()) {
      others.push_back(name);
    }
  }
  std::vector<std::string> columns{"step"};
  if (has_epoch) columns.push_back("epoch");
  columns.insert(columns.end(), others.begin(), others.end());
  columns_ = std::move(columns);
}

void CSVLogger::log_metrics(const std::map<std::string, double>& metrics, int64_t step) {
  load_existing_header();
  const auto before = columns_;
  add_columns(metrics);
  const std::string path = metrics_file();
  if (columns_ != before) rewrite(path, columns_);
  std::vector<std::string> row(columns_.size());
  row[0] = std::to_string(step);
  for (size_t i = 1; i < columns_.size(); ++i) {
    const auto it = metrics.find(columns_[i]);
    if (it != metrics.end()) row[i] = format(it->second);
  }
  std::ofstream out(path, std::ios::app);
  out << join(row);
  out.flush();
  if (!out) throw IoError("appending a row to the metrics file", path, errno);
}

void CSVLogger::log_hyperparams(const nlohmann::json& params) { detail::write_hparams(log_dir(), params, hparams_); }

}  // namespace loggers
}  // namespace lockstep
