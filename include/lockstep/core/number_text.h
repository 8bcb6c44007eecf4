#pragma once
/// Reading a number that a user typed: the whole text or nothing.

#include <optional>
#include <string>

namespace lockstep {

/// `text` as a double if all of it is one ("0.25", "10", "1e3"); nullopt for "", "abc", "1.5x",
/// or a value out of double's range.
std::optional<double> whole_number(const std::string& text);

}  // namespace lockstep
