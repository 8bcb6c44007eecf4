#pragma once
// Where glibc's malloc serves a block from: its heap or a mapping of its own, and whether the
// kernel may back a mapping with huge pages (core/heap.h's tests).

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#ifdef __GLIBC__
#include <malloc.h>
#endif

namespace lockstep {
namespace testing {

// "THPeligible" of the mapping of /proc/self/smaps that holds `address`, or -1 if none does.
inline int huge_pages_eligible(uintptr_t address) {
  std::ifstream smaps("/proc/self/smaps");
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    uintptr_t begin = 0, end = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &begin, &end) == 2 && line.find(':') > line.find(' ')) {
      inside = address >= begin && address < end;
    } else if (inside && line.rfind("THPeligible:", 0) == 0) {
      return std::stoi(line.substr(12));
    }
  }
  return -1;
}

// This kernel's transparent huge pages setting, as /sys shows it ("always [madvise] never").
inline std::string huge_pages_setting() {
  std::ifstream setting("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string thp;
  std::getline(setting, thp);
  return thp;
}

// Whether this kernel's transparent huge pages are "never".
inline bool huge_pages_never() {
  const std::string thp = huge_pages_setting();
  return thp.empty() || thp.find("[never]") != std::string::npos;
}

#ifdef __GLIBC__
// True when a block of `bytes` comes from the heap, false when malloc maps it.
inline bool heap_serves(size_t bytes) {
  const size_t mapped = mallinfo2().hblkhd;
  void* block = std::malloc(bytes);
  std::memset(block, 1, bytes);
  const bool from_heap = mallinfo2().hblkhd == mapped;
  std::free(block);
  return from_heap;
}

// Starts from a known state: glibc's mmap threshold at 1 MiB, fixed.
inline void small_mmap_threshold() { mallopt(M_MMAP_THRESHOLD, 1 << 20); }
#endif

}  // namespace testing
}  // namespace lockstep
