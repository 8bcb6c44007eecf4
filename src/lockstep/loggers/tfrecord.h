#pragma once
// TFRecord framing, the container of TensorBoard event files:
//   uint64 length (little-endian), uint32 masked CRC32C of those 8 bytes, the bytes,
//   uint32 masked CRC32C of the bytes.

#include <cstddef>
#include <cstdint>
#include <string>

namespace lockstep {
namespace loggers {
namespace detail {

/// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78); crc32c("123456789") == 0xE3069283.
uint32_t crc32c(const void* data, std::size_t size);

/// TFRecord's masking: rotate right by 15 bits, add 0xa282ead8.
uint32_t masked_crc32c(const void* data, std::size_t size);

/// `record` framed as one TFRecord.
std::string tfrecord(const std::string& record);

}  // namespace detail
}  // namespace loggers
}  // namespace lockstep
