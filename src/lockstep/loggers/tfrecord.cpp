#include "tfrecord.h"

#include <array>

namespace lockstep {
namespace loggers {
namespace detail {
namespace {

constexpr uint32_t kCastagnoli = 0x82F63B78u;
constexpr uint32_t kMaskDelta = 0xa282ead8u;

constexpr std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1u) ? kCastagnoli : 0u);
    table[i] = crc;
  }
  return table;
}

constexpr std::array<uint32_t, 256> kTable = make_table();

void append_le(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out += static_cast<char>((value >> (8 * i)) & 0xFF);
}

}  // namespace

uint32_t crc32c(const void* data, std::size_t size) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  uint32_t crc = 0xFFFFFFFFu;
  for (std::size_t i = 0; i < size; ++i) crc = kTable[(crc ^ bytes[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

uint32_t masked_crc32c(const void* data, std::size_t size) {
  const uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + kMaskDelta;
}

std::string tfrecord(const std::string& record) {
  std::string framed;
  append_le(framed, record.size(), 8);
  append_le(framed, masked_crc32c(framed.data(), 8), 4);
  framed += record;
  append_le(framed, masked_crc32c(record.data(), record.size()), 4);
  return framed;
}

}  // namespace detail
}  // namespace loggers
}  // namespace lockstep
