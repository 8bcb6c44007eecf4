// CheckpointIO::load (checkpoint/checkpoint_io.h) on arbitrary files: the zip check and the
// unpickler either return a checkpoint dict or say what is wrong (UsageError), never crash.
#include <lockstep/checkpoint/checkpoint_io.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "fuzz_support.h"

// Whole stacks: LibTorch has no frame pointers, and LeakSanitizer needs the frame that names its
// known leak (scripts/sanitizers/lsan.supp). Only here: it makes every allocation slower.
extern "C" const char* __asan_default_options() { return "fast_unwind_on_malloc=0"; }

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lockstep;
  // One file for the whole run, removed at exit.
  struct TempFile {
    std::string path;
    TempFile() {
      char name[] = "/tmp/lockstep_fuzz_ckpt_XXXXXX";
      const int fd = ::mkstemp(name);
      if (fd < 0) std::abort();
      ::close(fd);
      path = name;
    }
    ~TempFile() { std::remove(path.c_str()); }
  };
  static const TempFile file;
  const std::string& path = file.path;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  fuzz::expect_only_lockstep_errors([&] { checkpoint::CheckpointIO().load(path); });
  return 0;
}
