#include <lockstep/core/heap.h>

#include <cstdlib>
#include <cstring>

#ifdef __GLIBC__
#include <malloc.h>
#endif

namespace lockstep {
namespace core {
namespace {

// The mmap threshold at `bytes` and the trim threshold at twice that, as glibc's own adjustment
// pairs them; a threshold the user set stays.
void fix_thresholds(int bytes) {
#ifdef __GLIBC__
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  const auto user_set = [&](const char* variable, const char* tunable) {
    return std::getenv(variable) || (tunables && std::strstr(tunables, tunable));
  };
  if (user_set("MALLOC_MMAP_THRESHOLD_", "mmap_threshold")) return;
  mallopt(M_MMAP_THRESHOLD, bytes);
  if (!user_set("MALLOC_TRIM_THRESHOLD_", "trim_threshold")) mallopt(M_TRIM_THRESHOLD, 2 * bytes);
#else
  (void)bytes;
#endif
}

}  // namespace

void tune_heap_for_training() { fix_thresholds(32 << 20); }

void tune_heap_for_sharded_training() { fix_thresholds(8 << 20); }

}  // namespace core
}  // namespace lockstep
