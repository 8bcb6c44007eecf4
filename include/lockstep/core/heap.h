#pragma once
/// Heap tuning for training, a step of its own because it changes the whole process.

#include <cstddef>

namespace lockstep {
namespace core {

/// With glibc: fixes malloc's mmap threshold at 32 MiB and its trim threshold at 64 MiB, the most
/// glibc's own adjustment would reach, from the start. Left to itself glibc sets the trim
/// threshold to twice the largest mapped block freed so far, so a model whose temporaries are a few
/// MiB gives the top of its heap back to the system and faults it in again every step. Blocks
/// LibTorch allocates at or above the mmap threshold, mapped afresh each time, are asked for huge
/// pages (ask_for_huge_pages). A threshold the user set (MALLOC_MMAP_THRESHOLD_,
/// MALLOC_TRIM_THRESHOLD_ or their GLIBC_TUNABLES) is kept, and an mmap threshold of the user's
/// also leaves LibTorch's allocator alone. Elsewhere it does nothing. The Trainer and Fabric call it
/// before they set up a model; call it yourself to train with DistributedDataParallel without
/// them. Figures: docs/user-guide.md, "malloc's thresholds".
void tune_heap_for_training();

/// The same with an mmap threshold of 8 MiB and a trim threshold of 16 MiB, so that a freed block
/// of 8 MiB or more (a gathered unit, a gradient, Adam's temporaries) goes back to the system at
/// once, and comes back in huge pages. FSDPStrategy calls it; call it before constructing
/// FullyShardedDataParallel yourself. Why and the figures: docs/user-guide.md, "Sharded training".
void tune_heap_for_sharded_training();

/// Asks the kernel to back the whole 2 MiB pages inside [data, data + bytes) with transparent huge
/// pages (where THP is "madvise", Debian's default): the first touch of fresh memory then faults
/// 512 times less often. Linux only; elsewhere it does nothing.
void ask_for_huge_pages(const void* data, size_t bytes);

}  // namespace core
}  // namespace lockstep
