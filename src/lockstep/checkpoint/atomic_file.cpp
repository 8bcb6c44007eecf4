#include "atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

#include <lockstep/core/error.h>

namespace lockstep {
namespace checkpoint {
namespace detail {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void fail_write(const std::string& action, const std::string& path, const std::string& what, int error) {
  throw IoError(action, path, error,
                "It failed while " + what + "; the previous file at that path (if any) is unchanged. Check "
                "that the directory is writable and that the disk has free space.");
}

// A new file `<target>.tmp.XXXXXX` beside the target, created exclusively (mkostemp: O_EXCL, so
// a name planted in a shared directory, symlink or not, is never opened). Removed unless the
// rename consumed it, so no failure leaves one behind; a file it did not create is never removed.
class TemporaryFile {
 public:
  explicit TemporaryFile(const std::string& target) : path_(target + ".tmp.XXXXXX") {
    fd_ = ::mkostemp(path_.data(), O_CLOEXEC);
    created_ = fd_ >= 0;
  }
  ~TemporaryFile() {
    if (fd_ >= 0) ::close(fd_);
    if (created_ && !committed_) ::unlink(path_.c_str());
  }
  TemporaryFile(const TemporaryFile&) = delete;
  TemporaryFile& operator=(const TemporaryFile&) = delete;
  const std::string& path() const { return path_; }
  int& fd() { return fd_; }
  void commit() { committed_ = true; }

 private:
  std::string path_;
  int fd_ = -1;
  bool created_ = false;
  bool committed_ = false;
};

void sync_directory(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);  // Some filesystems refuse fsync on a directory; the rename has happened either way.
  ::close(fd);
}

}  // namespace

void write_atomically(const std::string& path, const std::string& action,
                      const std::function<void(const WriteBytes&)>& produce) {
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) fail_write(action, path, "creating directory '" + dir.string() + "'", error.value());
  TemporaryFile temp(path);
  if (temp.fd() < 0) fail_write(action, path, "creating " + temp.path(), errno);
  // mkostemp makes it 0600; a checkpoint is as readable as the files torch.save writes.
  if (::fchmod(temp.fd(), 0644) != 0) fail_write(action, path, "setting the permissions of " + temp.path(), errno);
  produce([&](const char* data, std::size_t size) {
    while (size > 0) {
      const ssize_t n = ::write(temp.fd(), data, size);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) fail_write(action, path, "writing " + temp.path(), errno);
      data += n;
      size -= static_cast<std::size_t>(n);
    }
  });
  if (::fsync(temp.fd()) != 0) fail_write(action, path, "syncing " + temp.path(), errno);
  const int fd = temp.fd();
  temp.fd() = -1;
  if (::close(fd) != 0) fail_write(action, path, "closing " + temp.path(), errno);
  if (::rename(temp.path().c_str(), path.c_str()) != 0) {
    fail_write(action, path, "renaming " + temp.path() + " over it", errno);
  }
  temp.commit();
  sync_directory(dir);
}

}  // namespace detail
}  // namespace checkpoint
}  // namespace lockstep
