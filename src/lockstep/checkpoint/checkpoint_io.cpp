#include <lockstep/checkpoint/checkpoint_io.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>

#include <caffe2/serialize/inline_container.h>
#include <c10/util/Exception.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include <lockstep/core/error.h>

#include "torch_file.h"
#include "zip_check.h"

namespace lockstep {
namespace checkpoint {
namespace {

namespace fs = std::filesystem;

const char* const kResumeHint =
    "Pass a checkpoint written by Lockstep (--ckpt-path PATH, or --ckpt-path last for the newest one)";

[[noreturn]] void fail_write(const std::string& path, const std::string& what, int error) {
  throw IoError("saving checkpoint", path, error,
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

void write_all(int fd, const char* data, std::size_t size, const std::string& path, const std::string& temp) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail_write(path, "writing " + temp, errno);
    data += n;
    size -= static_cast<std::size_t>(n);
  }
}

void sync_directory(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);  // Some filesystems refuse fsync on a directory; the rename has happened either way.
  ::close(fd);
}

void write_atomically(const std::vector<char>& bytes, const std::string& path) {
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) fail_write(path, "creating directory '" + dir.string() + "'", error.value());
  TemporaryFile temp(path);
  if (temp.fd() < 0) fail_write(path, "creating " + temp.path(), errno);
  // mkostemp makes it 0600; a checkpoint is as readable as the files torch.save writes.
  if (::fchmod(temp.fd(), 0644) != 0) fail_write(path, "setting the permissions of " + temp.path(), errno);
  write_all(temp.fd(), bytes.data(), bytes.size(), path, temp.path());
  if (::fsync(temp.fd()) != 0) fail_write(path, "syncing " + temp.path(), errno);
  const int fd = temp.fd();
  temp.fd() = -1;
  if (::close(fd) != 0) fail_write(path, "closing " + temp.path(), errno);
  if (::rename(temp.path().c_str(), path.c_str()) != 0) fail_write(path, "renaming " + temp.path() + " over it", errno);
  temp.commit();
  sync_directory(dir);
}

// The value with every list and dict made generic (element types Any), so the pickle holds plain
// lists and dicts instead of torch.jit._pickle.build_intlist(...) and restore_type_tag(...) calls.
c10::IValue untyped(const c10::IValue& value) {
  if (value.isList()) {
    c10::impl::GenericList out(c10::AnyType::get());
    for (const auto& item : value.toListRef()) out.push_back(untyped(item));
    return out;
  }
  if (value.isGenericDict()) {
    c10::impl::GenericDict out(c10::AnyType::get(), c10::AnyType::get());
    for (const auto& entry : value.toGenericDict()) out.insert(untyped(entry.key()), untyped(entry.value()));
    return out;
  }
  if (value.isTuple()) {
    std::vector<c10::IValue> items;
    for (const auto& item : value.toTupleRef().elements()) items.push_back(untyped(item));
    return c10::ivalue::Tuple::create(std::move(items));
  }
  return value;
}

// torch::pickle_save's archive (archive/data.pkl, archive/data/<N> per storage, archive/version)
// built from the same parts, but with the pickler's type tags off: torch.load(weights_only=True)
// refuses the torch.jit._pickle globals that tags and typed lists add, and it is the default
// from PyTorch 2.6 on.
std::vector<char> serialize(const c10::IValue& checkpoint) {
  std::vector<char> pickle;
  torch::jit::Pickler pickler([&](const char* bytes, size_t size) { pickle.insert(pickle.end(), bytes, bytes + size); },
                              /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
                              /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(untyped(checkpoint));
  pickler.stop();
  std::vector<char> archive;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* bytes, size_t size) {
    archive.insert(archive.end(), static_cast<const char*>(bytes), static_cast<const char*>(bytes) + size);
    return size;
  });
  torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(), writer);
  writer.writeEndOfFile();
  return archive;
}

[[noreturn]] void not_a_checkpoint(const std::string& path, const std::string& why) {
  throw UsageError("'" + path + "' is not a Lockstep checkpoint: " + why + ". " + kResumeHint + ".");
}

[[noreturn]] void damaged(const std::string& path, const std::string& why) {
  throw UsageError("checkpoint '" + path + "' is damaged: " + why +
                   ". It cannot be loaded: pass an earlier checkpoint (--ckpt-path PATH), or write the file again.");
}

std::vector<char> read_file(const std::string& path) {
  std::error_code error;
  const auto status = fs::status(path, error);
  if (!fs::exists(status)) {
    throw UsageError("checkpoint '" + path + "' does not exist. " + kResumeHint + ".");
  }
  if (fs::is_directory(status)) {
    throw UsageError("checkpoint '" + path + "' is a directory, not a file. " + kResumeHint +
                     "; checkpoints are the .ckpt files inside it.");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw UsageError("checkpoint '" + path + "' cannot be opened (" + std::generic_category().message(errno) +
                     "). Check its permissions, or pass another checkpoint (--ckpt-path PATH).");
  }
  in.seekg(0, std::ios::end);
  std::vector<char> bytes(static_cast<size_t>(std::max<std::streamoff>(in.tellg(), 0)));
  in.seekg(0, std::ios::beg);
  if (!in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()))) {
    throw UsageError("checkpoint '" + path + "' could not be read to the end (" +
                     std::generic_category().message(errno) + "). Check the disk, or pass another checkpoint (--ckpt-path PATH).");
  }
  return bytes;
}

void check_format(const std::string& path, const std::vector<char>& bytes) {
  if (bytes.empty()) damaged(path, "the file is empty");
  if (bytes.size() >= 2 && static_cast<unsigned char>(bytes[0]) == 0x80 && bytes[1] == 0x02) {
    not_a_checkpoint(path, "it is in torch.save's legacy format (_use_new_zipfile_serialization=False), "
                           "which LibTorch does not read");
  }
  if (bytes.size() < 4 || std::string(bytes.data(), 4) != std::string("PK\x03\x04", 4)) {
    not_a_checkpoint(path, "it is not a zip archive as written by torch.save");
  }
  const std::string problem = detail::check_zip(bytes.data(), bytes.size());
  if (!problem.empty()) damaged(path, problem);
}

}  // namespace

Checkpoint make_checkpoint() { return Checkpoint(c10::StringType::get(), c10::AnyType::get()); }

void CheckpointIO::save(const c10::IValue& checkpoint, const std::string& path) const {
  if (!checkpoint.isGenericDict()) {
    throw UsageError("CheckpointIO::save('" + path + "'): a checkpoint must be a dict, got a " +
                     checkpoint.type()->str() + ". Build it with lockstep::checkpoint::make_checkpoint().");
  }
  for (const auto& entry : checkpoint.toGenericDict()) {
    if (!entry.key().isString()) {
      throw UsageError("CheckpointIO::save('" + path + "'): checkpoint keys must be strings, got a " +
                       entry.key().type()->str() + " key. Use string keys such as \"state_dict\".");
    }
  }
  write_atomically(serialize(checkpoint), path);
}

Checkpoint CheckpointIO::load(const std::string& path) const {
  const std::vector<char> bytes = read_file(path);
  check_format(path, bytes);
  const detail::TorchFile file = detail::read_torch_file(bytes);
  if (file.damaged) damaged(path, file.problem);
  if (!file.problem.empty()) throw UsageError("'" + path + "' " + file.problem + ".");
  const c10::IValue& value = file.value;
  if (!value.isGenericDict()) not_a_checkpoint(path, "it holds a " + value.type()->str() + ", not a dict");
  for (const auto& entry : value.toGenericDict()) {
    if (!entry.key().isString()) not_a_checkpoint(path, "its dict has a non-string key (" + entry.key().type()->str() + ")");
  }
  return value.toGenericDict();
}

void CheckpointIO::remove(const std::string& path) const {
  std::error_code error;
  std::error_code ignored;
  if (fs::is_directory(path, ignored)) {
    fs::remove_all(path, error);
  } else {
    fs::remove(path, error);
  }
  if (error) {
    throw IoError("removing checkpoint", path, error,
                  "Check that its folder is writable: removing a file needs write permission on the folder.");
  }
}

void require_keys(const Checkpoint& checkpoint, const std::vector<std::string>& keys, const std::string& path) {
  std::string missing;
  for (const auto& key : keys) {
    if (!checkpoint.contains(key)) missing += (missing.empty() ? "\"" : ", \"") + key + "\"";
  }
  if (missing.empty()) return;
  std::string present;
  for (const auto& entry : checkpoint) {
    present += (present.empty() ? "\"" : ", \"") + entry.key().toStringRef() + "\"";
  }
  not_a_checkpoint(path, "it lacks the keys " + missing + " (it has " + (present.empty() ? "none" : present) + ")");
}

}  // namespace checkpoint
}  // namespace lockstep
