#include "run_directory.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <system_error>

#include <lockstep/core/error.h>

namespace lockstep {
namespace loggers {

namespace detail {
namespace {

namespace fs = std::filesystem;

const std::string kVersionPrefix = "version_";

std::optional<int64_t> version_number(const std::string& name) {
  if (name.rfind(kVersionPrefix, 0) != 0 || name.size() == kVersionPrefix.size()) return std::nullopt;
  const std::string digits = name.substr(kVersionPrefix.size());
  for (char c : digits) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return std::nullopt;
  }
  return digits.size() > 18 ? std::nullopt : std::optional<int64_t>(std::stoll(digits));
}

[[noreturn]] void cannot_create(const std::string& dir, int error) {
  throw UsageError("cannot create the log directory '" + dir + "' (" + std::generic_category().message(error) +
                   "). Pass a writable directory as the logger's root (--default-root-dir DIR).");
}

bool plain_string(const std::string& s) {
  static const std::set<std::string> reserved{"true", "false", "yes", "no", "on", "off", "null", "y", "n"};
  if (s.empty() || !std::isalpha(static_cast<unsigned char>(s[0]))) return false;
  for (char c : s) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '.' && c != '/' && c != '-') return false;
  }
  std::string lower;
  for (char c : s) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return reserved.count(lower) == 0;
}

std::string scalar(const nlohmann::json& v) {
  if (v.is_string()) {
    const auto& s = v.get_ref<const std::string&>();
    return plain_string(s) ? s : v.dump();  // A JSON string is a valid YAML double-quoted scalar.
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isnan(d)) return ".nan";
    if (std::isinf(d)) return d > 0 ? ".inf" : "-.inf";
    std::string text = v.dump();
    // YAML 1.1 (PyYAML) reads 1e-08 as a string; 1.0e-08 is a float.
    if (text.find('.') == std::string::npos) {
      const auto e = text.find_first_of("eE");
      text = e == std::string::npos ? text + ".0" : text.substr(0, e) + ".0" + text.substr(e);
    }
    return text;
  }
  return v.dump();  // integers, true/false, null
}

void emit_mapping(const nlohmann::json& object, int indent, std::string& out);

void emit_value(const nlohmann::json& v, int indent, std::string& out) {
  if (v.is_object() && !v.empty()) {
    out += "\n";
    emit_mapping(v, indent + 2, out);
  } else if (v.is_array() && !v.empty()) {
    out += "\n";
    for (const auto& item : v) {
      out += std::string(indent, ' ') + "- " + (item.is_structured() ? item.dump() : scalar(item)) + "\n";
    }
  } else {
    out += " " + (v.is_structured() ? v.dump() : scalar(v)) + "\n";
  }
}

void emit_mapping(const nlohmann::json& object, int indent, std::string& out) {
  for (const auto& [key, value] : object.items()) {
    out += std::string(indent, ' ') + scalar(nlohmann::json(key)) + ":";
    emit_value(value, indent, out);
  }
}

}  // namespace

std::string RunDirectory::experiment_dir() const {
  fs::path dir(options_.root_dir());
  if (!options_.name().empty()) dir /= options_.name();
  return dir.string();
}

std::string RunDirectory::claim() const {
  const std::string base = experiment_dir();
  std::error_code error;
  fs::create_directories(base, error);
  if (error) cannot_create(base, error.value());
  if (options_.version()) {
    const std::string name = kVersionPrefix + std::to_string(*options_.version());
    fs::create_directories(fs::path(base) / name, error);
    if (error) cannot_create((fs::path(base) / name).string(), error.value());
    return name;
  }
  int64_t next = 0;
  for (const auto& entry : fs::directory_iterator(base, error)) {
    const auto number = version_number(entry.path().filename().string());
    if (number && entry.is_directory()) next = std::max(next, *number + 1);
  }
  // mkdir is the claim: a process that loses the race to another moves on to the next number.
  for (;; ++next) {
    const std::string name = kVersionPrefix + std::to_string(next);
    const std::string path = (fs::path(base) / name).string();
    if (::mkdir(path.c_str(), 0755) == 0) return name;
    if (errno != EEXIST) cannot_create(path, errno);
  }
}

std::string RunDirectory::version() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!version_) version_ = claim();
  return *version_;
}

std::string RunDirectory::path() const { return (fs::path(experiment_dir()) / version()).string(); }

std::string to_yaml(const nlohmann::json& params) {
  if (params.empty()) return "{}\n";
  std::string out;
  emit_mapping(params, 0, out);
  return out;
}

void write_hparams(const std::string& dir, const nlohmann::json& params, nlohmann::json& merged) {
  if (!params.is_object()) {
    throw UsageError("log_hyperparams takes a JSON object (name -> value), got a " + std::string(params.type_name()) +
                     ": " + params.dump() + ". Wrap it, e.g. {\"value\": ...}.");
  }
  merged.update(params);
  write_file_atomically((fs::path(dir) / "hparams.yaml").string(), to_yaml(merged));
}

void write_file_atomically(const std::string& path, const std::string& text) {
  const std::string temp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) {
      const int error = errno;
      ::unlink(temp.c_str());
      throw IoError("writing", temp, error);
    }
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const int error = errno;
    ::unlink(temp.c_str());
    throw IoError("renaming '" + temp + "' to", path, error);
  }
}

}  // namespace detail
}  // namespace loggers
}  // namespace lockstep
