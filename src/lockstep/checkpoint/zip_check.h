#pragma once
// Integrity check for the zip archives torch::pickle_save writes: LibTorch's reader does not
// verify record CRC32s, so without this a flipped byte in a tensor loads as a wrong weight.

#include <cstddef>
#include <string>

namespace lockstep {
namespace checkpoint {
namespace detail {

/// "" when `data` is a zip archive whose stored records all match their CRC32 and which holds a
/// `data.pkl` record; otherwise what is wrong, in words ("record archive/data/3 fails its
/// CRC32 check", "no zip end-of-central-directory record: the file is truncated or not a zip").
std::string check_zip(const char* data, std::size_t size);

}  // namespace detail
}  // namespace checkpoint
}  // namespace lockstep
