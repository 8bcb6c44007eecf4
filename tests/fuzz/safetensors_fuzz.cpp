// load_safetensors (checkpoint/safetensors.h) on the input as a .safetensors file: the header
// length, the JSON header and the data are all the fuzzer's, so every check of the reader (the
// header's size and JSON, dtypes, shapes, data_offsets, BOOL bytes) and the memory map meet
// lies. A tensor that loads is read to its last byte, so a view past the mapping is a finding.
#include <lockstep/checkpoint/safetensors.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include <ATen/ATen.h>

#include "fuzz_support.h"

extern "C" const char* __asan_default_options() { return "fast_unwind_on_malloc=0"; }

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lockstep;
  struct TempFile {
    std::string path;
    TempFile() {
      char name[] = "/tmp/lockstep_fuzz_safetensors_XXXXXX";
      const int fd = ::mkstemp(name);
      if (fd < 0) std::abort();
      ::close(fd);
      path = name;
    }
    ~TempFile() { std::remove(path.c_str()); }
  };
  static const TempFile file;
  std::FILE* f = std::fopen(file.path.c_str(), "wb");
  if (!f || std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  fuzz::expect_only_lockstep_errors([&] {
    const auto loaded = checkpoint::load_safetensors(file.path);
    for (const auto& item : loaded.tensors) {
      const at::Tensor bytes = item.value().reshape({-1}).view(at::kByte);
      if (bytes.numel() > 0 && bytes.sum().item<int64_t>() < 0) std::abort();
    }
  });
  return 0;
}
