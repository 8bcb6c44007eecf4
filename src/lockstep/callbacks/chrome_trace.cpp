#include "chrome_trace.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include <ATen/record_function.h>

#include <lockstep/callbacks/metric_format.h>

namespace lockstep {
namespace detail {
namespace {

using torch::autograd::profiler::EventKind;
using torch::autograd::profiler::LegacyEvent;

// A pushed range whose pop has not come yet.
struct Open {
  size_t span;
  at::RecordFunctionHandle handle;
  double children_us = 0;
};

// The profiler's mark named `name` ("__start_profile", "__stop_profile"), or null.
const LegacyEvent* mark(const torch::autograd::profiler::thread_event_lists& events, const char* name) {
  for (const auto& list : events) {
    for (const auto& event : list) {
      if (event.kind() == EventKind::Mark && std::strcmp(event.name(), name) == 0) return &event;
    }
  }
  return nullptr;
}

// Ends the innermost open range at `end_us`, counting it as a child of the one around it.
void close_innermost(std::vector<TraceSpan>& spans, std::vector<Open>& open, double end_us) {
  const Open innermost = open.back();
  open.pop_back();
  auto& span = spans[innermost.span];
  span.duration_us = std::max(0.0, end_us - span.start_us);
  span.self_us = std::max(0.0, span.duration_us - innermost.children_us);
  if (!open.empty()) open.back().children_us += span.duration_us;
}

// Times are taken from the start mark in whole nanoseconds: a double of microseconds since the
// epoch keeps only quarters.
void add_thread(const std::vector<LegacyEvent>& events, const LegacyEvent& start, double stop_us,
                std::vector<TraceSpan>& spans) {
  constexpr auto user_scope = static_cast<uint8_t>(at::RecordScope::USER_SCOPE);
  std::vector<Open> open;
  for (const auto& event : events) {
    if (event.kind() == EventKind::PushRange) {
      spans.push_back({event.name(), start.cpuElapsedUs(event), 0, 0, event.threadId(), event.scope() == user_scope});
      open.push_back({spans.size() - 1, event.handle()});
      continue;
    }
    if (event.kind() != EventKind::PopRange) continue;
    const auto handle = event.handle();
    const auto match = std::find_if(open.rbegin(), open.rend(), [&](const Open& o) { return o.handle == handle; });
    if (match == open.rend()) continue;  // pushed before the profiler started
    // Ranges still open inside it end with it.
    while (open.back().handle != handle) close_innermost(spans, open, start.cpuElapsedUs(event));
    close_innermost(spans, open, start.cpuElapsedUs(event));
  }
  while (!open.empty()) close_innermost(spans, open, stop_us);
}

double microseconds(double value) { return std::round(value * 1000.0) / 1000.0; }

std::string cell(const std::string& text, size_t width) {
  return "|  " + text + std::string(width > text.size() ? width - text.size() : 0, ' ') + "  ";
}

}  // namespace

Trace trace_of(const torch::autograd::profiler::thread_event_lists& events) {
  Trace trace;
  const LegacyEvent* start = mark(events, "__start_profile");
  if (start == nullptr) return trace;  // never started: nothing recorded
  const LegacyEvent* stop = mark(events, "__stop_profile");
  const double stop_us = stop != nullptr ? start->cpuElapsedUs(*stop) : 0.0;
  trace.start_ns = std::llround(start->cpuUs() * 1000.0);
  for (const auto& list : events) add_thread(list, *start, stop_us, trace.spans);
  std::stable_sort(trace.spans.begin(), trace.spans.end(),
                   [](const auto& a, const auto& b) { return a.start_us < b.start_us; });
  return trace;
}

nlohmann::json chrome_trace(const Trace& trace, int rank) {
  auto events = nlohmann::json::array();
  const std::string process = "rank " + std::to_string(rank);
  events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", rank}, {"tid", 0}, {"args", {{"name", process}}}});
  events.push_back(
      {{"ph", "M"}, {"name", "process_sort_index"}, {"pid", rank}, {"tid", 0}, {"args", {{"sort_index", rank}}}});
  for (const auto& span : trace.spans) {
    events.push_back({{"ph", "X"},
                      {"cat", span.annotation ? "user_annotation" : "cpu_op"},
                      {"name", span.name},
                      {"pid", rank},
                      {"tid", span.thread},
                      {"ts", microseconds(span.start_us)},
                      {"dur", microseconds(span.duration_us)},
                      {"args", {{"self_us", microseconds(span.self_us)}}}});
  }
  return {{"schemaVersion", 1},
          {"distributedInfo", {{"rank", rank}}},
          {"baseTimeNanoseconds", trace.start_ns},
          {"displayTimeUnit", "ms"},
          {"traceEvents", std::move(events)}};
}

std::string span_table(const std::vector<TraceSpan>& spans, size_t rows) {
  struct Sums {
    double self_us = 0, total_us = 0;
    int64_t calls = 0;
  };
  std::map<std::string, Sums> by_name;
  double all_self_us = 0;
  for (const auto& span : spans) {
    auto& sums = by_name[span.name];
    sums.self_us += span.self_us;
    sums.total_us += span.duration_us;
    ++sums.calls;
    all_self_us += span.self_us;
  }
  std::vector<std::pair<std::string, Sums>> sorted(by_name.begin(), by_name.end());
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const auto& a, const auto& b) { return a.second.self_us > b.second.self_us; });
  sorted.resize(std::min(rows, sorted.size()));
  constexpr size_t longest = 60;
  for (auto& row : sorted) {
    if (row.first.size() > longest) row.first = row.first.substr(0, longest - 3) + "...";
  }
  size_t name_width = std::string("Name").size();
  for (const auto& row : sorted) name_width = std::max(name_width, row.first.size());
  const size_t widths[] = {name_width, 13, 10, 14, 9};
  auto line = [&](const std::vector<std::string>& cells) {
    std::string text;
    for (size_t i = 0; i < cells.size(); ++i) text += cell(cells[i], widths[i]);
    return text + "|\n";
  };
  const std::string header = line({"Name", "Self CPU (ms)", "Self CPU %", "CPU total (ms)", "Calls"});
  const std::string rule(header.size() - 1, '-');
  std::string table = rule + "\n" + header + rule + "\n";
  for (const auto& [name, sums] : sorted) {
    table += line({name, format_number("%.3f", sums.self_us / 1000.0),
                   format_number("%.2f", all_self_us > 0 ? 100.0 * sums.self_us / all_self_us : 0.0),
                   format_number("%.3f", sums.total_us / 1000.0), std::to_string(sums.calls)});
  }
  return table + rule + "\n";
}

}  // namespace detail
}  // namespace lockstep
