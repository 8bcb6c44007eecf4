#include <lockstep/core/heap.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>

#ifdef __GLIBC__
#include <malloc.h>
#endif
#ifdef __linux__
#include <sys/mman.h>
#endif

#include <c10/core/CPUAllocator.h>

#include <lockstep/core/libtorch_compat.h>

namespace lockstep {
namespace core {
namespace {

// LibTorch's CPU allocator as it was, asking for huge pages for each block of at least `from`
// bytes: glibc maps those afresh, and each of their first touches would fault in one 4 KiB page.
class HugePageAllocator final : public libtorch::AllocatorOver {
 public:
  HugePageAllocator(c10::Allocator* wrapped, size_t from) : AllocatorOver(wrapped), from_(from) {}
  void lower_to(size_t from) {  // under huge_pages_from's lock
    if (from < from_.load()) from_.store(from);
  }

 private:
  c10::DataPtr allocate_over(size_t bytes) const override {
    auto data = wrapped()->allocate(bytes);
    if (bytes >= from_.load(std::memory_order_relaxed)) ask_for_huge_pages(data.get(), bytes);
    return data;
  }

  std::atomic<size_t> from_;
};

// Installs the allocator above for blocks of `bytes` or more (the lowest asked for so far).
void huge_pages_from(size_t bytes) {
  static std::mutex mutex;
  static HugePageAllocator* allocator = nullptr;  // lives as long as the process, as LibTorch's own
  std::lock_guard<std::mutex> lock(mutex);
  if (allocator) {
    allocator->lower_to(bytes);
    return;
  }
  allocator = new HugePageAllocator(c10::GetCPUAllocator(), bytes);
  c10::SetCPUAllocator(allocator, /*priority=*/1);
}

// The mmap threshold at `bytes` and the trim threshold at twice that, as glibc's own adjustment
// pairs them; blocks from the threshold up in huge pages. A threshold the user set stays, and
// then so does the allocator.
void fix_thresholds(int bytes) {
#ifdef __GLIBC__
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  const auto user_set = [&](const char* variable, const char* tunable) {
    return std::getenv(variable) || (tunables && std::strstr(tunables, tunable));
  };
  if (user_set("MALLOC_MMAP_THRESHOLD_", "mmap_threshold")) return;
  mallopt(M_MMAP_THRESHOLD, bytes);
  if (!user_set("MALLOC_TRIM_THRESHOLD_", "trim_threshold")) mallopt(M_TRIM_THRESHOLD, 2 * bytes);
  huge_pages_from(static_cast<size_t>(bytes));
#else
  (void)bytes;
#endif
}

}  // namespace

void ask_for_huge_pages(const void* data, size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHugePage = 2 << 20;
  const auto begin = (reinterpret_cast<uintptr_t>(data) + kHugePage - 1) & ~(kHugePage - 1);
  const auto end = (reinterpret_cast<uintptr_t>(data) + bytes) & ~(kHugePage - 1);
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#else
  (void)data;
  (void)bytes;
#endif
}

void tune_heap_for_training() { fix_thresholds(32 << 20); }

void tune_heap_for_sharded_training() { fix_thresholds(8 << 20); }

}  // namespace core
}  // namespace lockstep
