#pragma once
// A Chrome trace that PyTorchProfiler wrote, read back, and the checks every such trace passes.

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace lockstep {
namespace testing {

struct ProfilerTrace {
  nlohmann::json json;
  std::vector<nlohmann::json> spans;  // the complete ("ph": "X") events

  int64_t count(const std::string& name) const {
    int64_t n = 0;
    for (const auto& span : spans) n += span["name"] == name ? 1 : 0;
    return n;
  }
  std::vector<nlohmann::json> named(const std::string& name) const {
    std::vector<nlohmann::json> found;
    for (const auto& span : spans) {
      if (span["name"] == name) found.push_back(span);
    }
    return found;
  }
};

/// The trace at `path`, parsed (a file that is not JSON fails the test), after checking what
/// chrome://tracing and Perfetto need: a traceEvents array whose complete events have a name, a
/// ts and a dur of 0 or more, and the process id `rank`, named "rank <rank>".
inline ProfilerTrace read_profiler_trace(const std::filesystem::path& path, int rank) {
  ProfilerTrace trace;
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  trace.json = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(trace.json.is_discarded()) << path << " is not JSON";
  if (trace.json.is_discarded() || !trace.json.contains("traceEvents")) {
    ADD_FAILURE() << path << " has no traceEvents";
    return trace;
  }
  bool named_process = false;
  for (const auto& event : trace.json["traceEvents"]) {
    EXPECT_EQ(event["pid"], rank) << event.dump();
    if (event["ph"] == "M" && event["name"] == "process_name") {
      named_process = event["args"]["name"] == "rank " + std::to_string(rank);
    }
    if (event["ph"] != "X") continue;
    EXPECT_TRUE(event["name"].is_string() && !event["name"].get<std::string>().empty()) << event.dump();
    EXPECT_GE(event["ts"].get<double>(), 0.0) << event.dump();
    EXPECT_GE(event["dur"].get<double>(), 0.0) << event.dump();
    EXPECT_LE(event["args"]["self_us"].get<double>(), event["dur"].get<double>()) << event.dump();
    trace.spans.push_back(event);
  }
  EXPECT_TRUE(named_process) << path;
  return trace;
}

/// Whether `inner` lies within `outer` on the same thread.
inline bool nested(const nlohmann::json& inner, const nlohmann::json& outer) {
  const double start = inner["ts"].get<double>(), end = start + inner["dur"].get<double>();
  const double outer_start = outer["ts"].get<double>(), outer_end = outer_start + outer["dur"].get<double>();
  return inner["tid"] == outer["tid"] && start >= outer_start && end <= outer_end + 1e-3;
}

}  // namespace testing
}  // namespace lockstep
