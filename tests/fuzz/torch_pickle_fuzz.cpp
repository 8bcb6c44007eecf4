// CheckpointIO::load (checkpoint/checkpoint_io.h) on torch.save archives whose data.pkl is the
// input: the archive around it is valid (records and CRC32s), so every input reaches the pickle
// rewrite (checkpoint/torch_pickle.cpp), LibTorch's unpickler and the tensors' bounds check.
// Records data/0 ... data/7 hold 256 bytes each, for the storages a pickle names.
#include <lockstep/checkpoint/checkpoint_io.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <caffe2/serialize/inline_container.h>

#include "fuzz_support.h"

extern "C" const char* __asan_default_options() { return "fast_unwind_on_malloc=0"; }

namespace {

std::vector<char> archive_around(const uint8_t* pickle, size_t size) {
  std::vector<char> bytes;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t n) {
    bytes.insert(bytes.end(), static_cast<const char*>(data), static_cast<const char*>(data) + n);
    return n;
  });
  writer.writeRecord("data.pkl", pickle, size);
  static const std::vector<char> storage(256, 1);
  for (int i = 0; i < 8; ++i) writer.writeRecord("data/" + std::to_string(i), storage.data(), storage.size());
  writer.writeEndOfFile();
  return bytes;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lockstep;
  struct TempFile {
    std::string path;
    TempFile() {
      char name[] = "/tmp/lockstep_fuzz_pickle_XXXXXX";
      const int fd = ::mkstemp(name);
      if (fd < 0) std::abort();
      ::close(fd);
      path = name;
    }
    ~TempFile() { std::remove(path.c_str()); }
  };
  static const TempFile file;
  const std::vector<char> bytes = archive_around(data, size);
  std::FILE* f = std::fopen(file.path.c_str(), "wb");
  if (!f || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) std::abort();
  std::fclose(f);
  fuzz::expect_only_lockstep_errors([&] { checkpoint::CheckpointIO().load(file.path); });
  return 0;
}
