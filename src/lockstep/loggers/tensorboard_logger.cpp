#include <lockstep/loggers/tensorboard_logger.h>

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include <lockstep/core/error.h>

#include "run_directory.h"
#include "tfrecord.h"

namespace lockstep {
namespace loggers {
namespace {

// The few protocol buffer fields an event file needs (tensorflow/core/util/event.proto,
// tensorflow/core/framework/summary.proto), written in the wire format by hand.
enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };
constexpr uint32_t kEventWallTime = 1, kEventStep = 2, kEventFileVersion = 3, kEventSummary = 5;
constexpr uint32_t kSummaryValue = 1;
constexpr uint32_t kValueTag = 1, kValueSimpleValue = 2;

void varint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out += static_cast<char>((value & 0x7F) | 0x80);
    value >>= 7;
  }
  out += static_cast<char>(value);
}

void key(std::string& out, uint32_t field, WireType type) { varint(out, (field << 3) | type); }

void fixed(std::string& out, uint64_t bits, int bytes) {
  for (int i = 0; i < bytes; ++i) out += static_cast<char>((bits >> (8 * i)) & 0xFF);
}

void bytes_field(std::string& out, uint32_t field, const std::string& bytes) {
  key(out, field, kLengthDelimited);
  varint(out, bytes.size());
  out += bytes;
}

void double_field(std::string& out, uint32_t field, double value) {
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  key(out, field, kFixed64);
  fixed(out, bits, 8);
}

void float_field(std::string& out, uint32_t field, float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  key(out, field, kFixed32);
  fixed(out, bits, 4);
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// TensorBoard's HParams tab (tensorboard/plugins/hparams/plugin_data.proto and api.proto): one
// summary "_hparams_/session_start_info" holding each hparam as a google.protobuf.Value, from
// which TensorBoard infers the experiment. Nested names are joined with "/" and lists written as
// their JSON text, as Lightning's TensorBoardLogger flattens and sanitizes them.
constexpr uint32_t kValueMetadata = 9, kMetadataPluginData = 1, kPluginName = 1, kPluginContent = 2;
constexpr uint32_t kHparamsSessionStartInfo = 3, kSessionHparams = 1, kMapKey = 1, kMapValue = 2;
constexpr uint32_t kNumberValue = 2, kStringValue = 3, kBoolValue = 4;

void flatten(const nlohmann::json& params, const std::string& prefix, nlohmann::json& flat) {
  for (const auto& [key, value] : params.items()) {
    const std::string name = prefix.empty() ? key : prefix + "/" + key;
    if (value.is_object() && !value.empty()) {
      flatten(value, name, flat);
    } else {
      flat[name] = value;
    }
  }
}

std::string protobuf_value(const nlohmann::json& value) {
  std::string out;
  if (value.is_boolean()) {
    key(out, kBoolValue, kVarint);
    varint(out, value.get<bool>() ? 1 : 0);
  } else if (value.is_number()) {
    double_field(out, kNumberValue, value.get<double>());
  } else {
    bytes_field(out, kStringValue, value.is_string() ? value.get<std::string>() : value.dump());
  }
  return out;
}

std::string session_start_summary(const nlohmann::json& params) {
  nlohmann::json flat = nlohmann::json::object();
  flatten(params, "", flat);
  std::string session;
  for (const auto& [name, value] : flat.items()) {
    std::string entry;
    bytes_field(entry, kMapKey, name);
    bytes_field(entry, kMapValue, protobuf_value(value));
    bytes_field(session, kSessionHparams, entry);
  }
  std::string content, plugin, metadata, summary_value, summary;
  bytes_field(content, kHparamsSessionStartInfo, session);  // version 0: the field is left out
  bytes_field(plugin, kPluginName, "hparams");
  bytes_field(plugin, kPluginContent, content);
  bytes_field(metadata, kMetadataPluginData, plugin);
  bytes_field(summary_value, kValueTag, "_hparams_/session_start_info");
  bytes_field(summary_value, kValueMetadata, metadata);
  bytes_field(summary, kSummaryValue, summary_value);
  return summary;
}

std::string hostname() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

}  // namespace

TensorBoardLogger::TensorBoardLogger(LoggerOptions options)
    : options_(std::move(options)), run_(std::make_unique<detail::RunDirectory>(options_)) {}

TensorBoardLogger::~TensorBoardLogger() {
  if (file_ != nullptr) std::fclose(file_);
}

std::string TensorBoardLogger::name() const { return options_.name(); }
std::string TensorBoardLogger::version() const { return run_->version(); }
std::string TensorBoardLogger::save_dir() const { return options_.root_dir(); }
std::string TensorBoardLogger::log_dir() const { return run_->path(); }

void TensorBoardLogger::open() {
  if (!event_path_.empty()) {  // Reopened after finalize: keep writing the same file.
    file_ = std::fopen(event_path_.c_str(), "ab");
    if (file_ == nullptr) {
      throw IoError("reopening the TensorBoard event file", event_path_, errno);
    }
    return;
  }
  const double wall_time = now_seconds();
  const std::string file_name = "events.out.tfevents." + std::to_string(static_cast<int64_t>(wall_time)) + "." +
                                hostname() + "." + std::to_string(::getpid()) + ".0";
  event_path_ = (std::filesystem::path(log_dir()) / file_name).string();
  file_ = std::fopen(event_path_.c_str(), "wb");
  if (file_ == nullptr) {
    throw IoError("creating the TensorBoard event file", event_path_, errno);
  }
  std::string event;
  double_field(event, kEventWallTime, wall_time);
  bytes_field(event, kEventFileVersion, "brain.Event:2");
  write_record(event);
}

void TensorBoardLogger::write_record(const std::string& bytes) {
  const std::string framed = detail::tfrecord(bytes);
  if (std::fwrite(framed.data(), 1, framed.size(), file_) != framed.size() || std::fflush(file_) != 0) {
    throw IoError("writing the TensorBoard event file", event_path_, errno);
  }
}

void TensorBoardLogger::log_metrics(const std::map<std::string, double>& metrics, int64_t step) {
  if (file_ == nullptr) open();
  std::string summary;
  for (const auto& [tag, value] : metrics) {
    std::string entry;
    bytes_field(entry, kValueTag, tag);
    float_field(entry, kValueSimpleValue, static_cast<float>(value));
    bytes_field(summary, kSummaryValue, entry);
  }
  std::string event;
  double_field(event, kEventWallTime, now_seconds());
  key(event, kEventStep, kVarint);
  varint(event, static_cast<uint64_t>(step));  // int64 in proto: negatives take ten bytes.
  bytes_field(event, kEventSummary, summary);
  write_record(event);
}

void TensorBoardLogger::log_hyperparams(const nlohmann::json& params) {
  detail::write_hparams(log_dir(), params, hparams_);
  if (hparams_.empty()) return;
  if (file_ == nullptr) open();
  std::string event;
  double_field(event, kEventWallTime, now_seconds());
  bytes_field(event, kEventSummary, session_start_summary(hparams_));
  write_record(event);
}

void TensorBoardLogger::save() {
  if (file_ != nullptr) std::fflush(file_);
}

void TensorBoardLogger::finalize(const std::string& status) {
  if (file_ == nullptr) return;
  std::fclose(file_);
  file_ = nullptr;
}

}  // namespace loggers
}  // namespace lockstep
