#pragma once
// The events of LibTorch's legacy profiler as spans, written in Chrome's trace format (which
// chrome://tracing and Perfetto open) and tabled by self time, for PyTorchProfiler.

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/csrc/autograd/profiler_legacy.h>

namespace lockstep {
namespace detail {

/// One range of the trace: a record_function range (the Trainer's actions) or an operation.
struct TraceSpan {
  std::string name;
  double start_us = 0;  // since the profiler started
  double duration_us = 0;
  double self_us = 0;  // less the spans directly inside it on its thread
  uint64_t thread = 0;
  bool annotation = false;  // a record_function range, not an operation
};

/// What the profiler saw between its start and its stop.
struct Trace {
  int64_t start_ns = 0;  // when it started, in nanoseconds since the Unix epoch
  std::vector<TraceSpan> spans;  // by start
};

/// The spans of `events` (disableProfilerLegacy's lists): each push paired with its pop on its
/// thread; a range still open when the profiler stopped ends at the stop.
Trace trace_of(const torch::autograd::profiler::thread_event_lists& events);

/// {"traceEvents": [...]} of `trace` as process `rank`, named "rank <R>": times in microseconds
/// since the start, which "baseTimeNanoseconds" gives (as Kineto's traces do).
nlohmann::json chrome_trace(const Trace& trace, int rank);

/// The `rows` names with the most self time: self and total milliseconds, share, calls. Names
/// longer than 60 characters are cut.
std::string span_table(const std::vector<TraceSpan>& spans, size_t rows);

}  // namespace detail
}  // namespace lockstep
