#pragma once
// A c10d store holds bytes; Lockstep keeps text in it (not installed).

#include <cstdint>
#include <string>
#include <vector>

namespace lockstep {
namespace distributed {
namespace detail {

inline std::string text_of(const std::vector<uint8_t>& bytes) { return std::string(bytes.begin(), bytes.end()); }
inline std::vector<uint8_t> bytes_of(const std::string& text) { return std::vector<uint8_t>(text.begin(), text.end()); }

}  // namespace detail
}  // namespace distributed
}  // namespace lockstep
