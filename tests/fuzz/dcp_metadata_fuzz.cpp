// load_dcp (checkpoint/dcp_checkpoint.h) on a folder whose `.metadata` is the input: DCP's pickled
// Metadata, read by Lockstep's own pickle machine (checkpoint/dcp_metadata.cpp), then the key
// table and the records it points at in __0_0.distcp (4096 bytes that are not a torch.save archive,
// so a record that passes the bounds checks is still refused).
#include <lockstep/checkpoint/dcp_checkpoint.h>

#include <stdlib.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "fuzz_support.h"

extern "C" const char* __asan_default_options() { return "fast_unwind_on_malloc=0"; }

namespace {

void write_file(const std::string& path, const char* data, size_t size) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
}

struct Folder {
  std::string path;
  Folder() {
    char name[] = "/tmp/lockstep_fuzz_dcp_XXXXXX";
    if (!::mkdtemp(name)) std::abort();
    path = name;
    const std::vector<char> data(4096, 1);
    write_file(path + "/__0_0.distcp", data.data(), data.size());
  }
  ~Folder() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lockstep;
  static const Folder folder;
  write_file(folder.path + "/.metadata", reinterpret_cast<const char*>(data), size);
  fuzz::expect_only_lockstep_errors([&] { checkpoint::load_dcp(folder.path); });
  return 0;
}
