#pragma once
/// Heap tuning for sharded training, a step of its own because it changes the whole process.

namespace lockstep {
namespace core {

/// With glibc: fixes malloc's mmap threshold at 8 MiB, so that a freed block of that size or more
/// goes back to the system, and its trim threshold at twice that (what glibc's own adjustment
/// would set, which the fixed threshold stops). A threshold the user set (MALLOC_MMAP_THRESHOLD_,
/// MALLOC_TRIM_THRESHOLD_ or their GLIBC_TUNABLES) is kept. Elsewhere it does nothing.
/// FSDPStrategy calls it; call it before constructing FullyShardedDataParallel yourself. Why and
/// the figures: docs/user-guide.md, "Sharded training".
void tune_heap_for_sharded_training();

}  // namespace core
}  // namespace lockstep
