#include <lockstep/callbacks/metric_format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace lockstep {
namespace detail {

std::string python_float(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char buffer[64];
  int digits = 1;
  for (; digits <= 17; ++digits) {
    std::snprintf(buffer, sizeof buffer, "%.*e", digits - 1, value);
    if (std::strtod(buffer, nullptr) == value) break;
  }
  const std::string scientific = buffer;
  const auto e = scientific.find('e');
  const int exponent = std::atoi(scientific.c_str() + e + 1);
  // Python's repr uses exponent notation outside 1e-4 <= |value| < 1e16, else fixed with at
  // least one decimal.
  if (exponent < -4 || exponent >= 16) {
    std::snprintf(buffer, sizeof buffer, "%se%c%02d", scientific.substr(0, e).c_str(), exponent < 0 ? '-' : '+',
                  std::abs(exponent));
    return buffer;
  }
  std::snprintf(buffer, sizeof buffer, "%.*f", std::max(digits - 1 - exponent, 1), value);
  return buffer;
}

std::string format_number(const char* format, double value) {
  char buffer[128];
  std::snprintf(buffer, sizeof buffer, format, value);
  return buffer;
}

std::string short_number(double value) {
  // tqdm's format_num: '{:.3g}' without the exponent's leading zero ("1.23e-5" for 1.23e-05).
  std::string text = format_number("%.3g", value);
  for (const char* zero : {"e-0", "e+0"}) {
    const auto at = text.find(zero);
    if (at != std::string::npos) text.erase(at + 2, 1);
  }
  return text;
}

}  // namespace detail
}  // namespace lockstep
