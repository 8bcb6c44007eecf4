#pragma once
// Writing a file so that a reader sees the old one or the whole new one, never half of either:
// CheckpointIO's torch.save archives and the safetensors files both go through it.

#include <cstddef>
#include <functional>
#include <string>

namespace lockstep {
namespace checkpoint {
namespace detail {

/// Appends bytes to the file being written.
using WriteBytes = std::function<void(const char* data, std::size_t size)>;

/// Writes `path` from what `produce` passes to its WriteBytes, creating missing parent folders.
/// The bytes go to a new `<path>.tmp.XXXXXX` (created exclusively, so never a name or symlink
/// planted in a shared folder), which is fsync'ed, renamed over `path`, and the folder fsync'ed.
/// On any failure, an exception from `produce` included, the previous file at `path` is left as
/// it was and the temporary file removed; a failure of the OS is an IoError naming `action`
/// ("saving checkpoint"), the path, the step and the OS's reason.
void write_atomically(const std::string& path, const std::string& action,
                      const std::function<void(const WriteBytes&)>& produce);

}  // namespace detail
}  // namespace checkpoint
}  // namespace lockstep
