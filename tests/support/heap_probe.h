#pragma once
// Where glibc's malloc serves a block from: its heap or a mapping of its own (core/heap.h's tests).

#include <cstddef>
#include <cstring>

#ifdef __GLIBC__
#include <malloc.h>
#endif

namespace lockstep {
namespace testing {

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
