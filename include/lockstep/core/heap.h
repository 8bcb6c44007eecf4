#pragma once
/// Heap tuning for training, a step of its own because it changes the whole process.

namespace lockstep {
namespace core {

/// With glibc: fixes malloc's mmap threshold at 32 MiB and its trim threshold at 64 MiB, the most
/// glibc's own adjustment would reach, from the start. Left to itself glibc sets the trim
/// threshold to twice the largest mapped block freed so far, so a model whose temporaries are a few
/// MiB gives the top of its heap back to the system and faults it in again every step. A
/// threshold the user set (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_ or their GLIBC_TUNABLES)
/// is kept. Elsewhere it does nothing. The Trainer and Fabric call it before they set up a model;
/// call it yourself to train with DistributedDataParallel without them. Figures: docs/user-guide.md,
/// "malloc's thresholds".
void tune_heap_for_training();

/// The same with an mmap threshold of 8 MiB and a trim threshold of 16 MiB, so that a freed block
/// of 8 MiB or more (a gathered unit) goes back to the system at once. FSDPStrategy calls it; call
/// it before constructing FullyShardedDataParallel yourself. Why and the figures:
/// docs/user-guide.md, "Sharded training".
void tune_heap_for_sharded_training();

}  // namespace core
}  // namespace lockstep
