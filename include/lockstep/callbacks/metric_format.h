#pragma once
/// How callbacks write numbers in file names and messages, as Lightning's Python would.

#include <string>

namespace lockstep {
namespace detail {

/// Python's repr of a float: the shortest text that reads back as the same double ("0.1",
/// "1e-05", "100.0", "nan", "inf").
std::string python_float(double value);

/// printf-style formatting into a std::string: format_number("%.3f", 0.12345) == "0.123".
std::string format_number(const char* format, double value);

/// A metric as tqdm (Lightning's progress bar) shows it: 3 significant digits ("0.123",
/// "1.23e-05", "12.3").
std::string short_number(double value);

}  // namespace detail
}  // namespace lockstep
