#include <lockstep/callbacks/simple_profiler.h>

#include <algorithm>
#include <vector>

#include <lockstep/callbacks/metric_format.h>

namespace lockstep {
namespace {

std::string cell(const std::string& text, size_t width) {
  return "|  " + text + std::string(width > text.size() ? width - text.size() : 0, ' ') + "  ";
}

}  // namespace

SimpleProfiler::SimpleProfiler(std::string title)
    : title_(std::move(title)), start_(std::chrono::steady_clock::now()) {}

void SimpleProfiler::record(const std::string& action, double seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto& s = stats_[action];
  s.min_seconds = s.calls == 0 ? seconds : std::min(s.min_seconds, seconds);
  s.max_seconds = s.calls == 0 ? seconds : std::max(s.max_seconds, seconds);
  s.total_seconds += seconds;
  ++s.calls;
}

std::map<std::string, SimpleProfiler::Stats> SimpleProfiler::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

double SimpleProfiler::elapsed_seconds() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void SimpleProfiler::reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.clear();
  start_ = std::chrono::steady_clock::now();
}

std::string SimpleProfiler::summary() const {
  const auto all = stats();
  const double wall = elapsed_seconds();
  std::vector<std::pair<std::string, Stats>> rows(all.begin(), all.end());
  std::stable_sort(rows.begin(), rows.end(),
                   [](const auto& a, const auto& b) { return a.second.total_seconds > b.second.total_seconds; });
  int64_t calls = 0;
  size_t name_width = std::string("Action").size();
  for (const auto& [action, s] : rows) {
    calls += s.calls;
    name_width = std::max(name_width, action.size());
  }
  const size_t widths[] = {name_width, 17, 9, 14, 12};
  auto line = [&](const std::vector<std::string>& cells) {
    std::string text;
    for (size_t i = 0; i < cells.size(); ++i) text += cell(cells[i], widths[i]);
    return text + "|\n";
  };
  const std::string header =
      line({"Action", "Mean duration (s)", "Num calls", "Total time (s)", "Percentage %"});
  const std::string rule(header.size() - 1, '-');
  std::string report = title_ + " Profiler Report\n" + rule + "\n" + header + rule + "\n";
  report += line({"Total", "-", std::to_string(calls), detail::format_number("%.5g", wall), "100 %"});
  report += rule + "\n";
  for (const auto& [action, s] : rows) {
    report += line({action, detail::format_number("%.5g", s.mean_seconds()), std::to_string(s.calls),
                    detail::format_number("%.5g", s.total_seconds),
                    detail::format_number("%.3f", wall > 0 ? 100.0 * s.total_seconds / wall : 0.0)});
  }
  return report + rule + "\n";
}

}  // namespace lockstep
