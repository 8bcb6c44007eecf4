#include <lockstep/core/heap.h>

#include <cstdlib>
#include <cstring>

#ifdef __GLIBC__
#include <malloc.h>
#endif

namespace lockstep {
namespace core {

void tune_heap_for_sharded_training() {
#ifdef __GLIBC__
  constexpr int kMmapThresholdBytes = 8 << 20;
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  const auto user_set = [&](const char* variable, const char* tunable) {
    return std::getenv(variable) || (tunables && std::strstr(tunables, tunable));
  };
  if (user_set("MALLOC_MMAP_THRESHOLD_", "mmap_threshold")) return;
  mallopt(M_MMAP_THRESHOLD, kMmapThresholdBytes);
  if (!user_set("MALLOC_TRIM_THRESHOLD_", "trim_threshold")) mallopt(M_TRIM_THRESHOLD, 2 * kMmapThresholdBytes);
#endif
}

}  // namespace core
}  // namespace lockstep
