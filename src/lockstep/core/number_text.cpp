#include <lockstep/core/number_text.h>

#include <stdexcept>

namespace lockstep {

std::optional<double> whole_number(const std::string& text) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (used != text.size()) return std::nullopt;
  return value;
}

}  // namespace lockstep
