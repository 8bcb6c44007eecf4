// The heap tuning training and sharded training ask for (core/heap.h), with glibc.
#include <lockstep/core/heap.h>

#include <cstdlib>
#include <cstring>
#include <string>

#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../../support/heap_probe.h"

namespace lockstep {
namespace core {
namespace {

#ifdef __GLIBC__
// Once tuned, a freed block of 8 MiB or more goes back to the system, even after a
// larger block was freed: glibc alone would raise its mmap threshold to that block's size and
// serve the next 8 MiB blocks from the heap, where they stay resident after they are freed.
TEST(Heap, BlocksOfEightMiBStayMappedAfterALargerBlockIsFreed) {
  tune_heap_for_sharded_training();
  at::empty({6 << 20}, at::kFloat).fill_(1);  // 24 MiB, mapped, freed
  const size_t mapped_before = mallinfo2().hblkhd;
  auto block = at::empty({2 << 20}, at::kFloat);  // 8 MiB
  EXPECT_GE(mallinfo2().hblkhd, mapped_before + (8u << 20)) << "an 8 MiB block came from the heap";
}

// ... while the heap keeps its free top (up to 16 MiB, as glibc does behind an 8 MiB threshold):
// with a fixed mmap threshold alone glibc would trim it at 128 KiB, and every step would fault
// the top of the heap in again.
TEST(Heap, TheHeapKeepsAFreedBlockBelowEightMiB) {
  tune_heap_for_sharded_training();
  void* block = std::malloc(2 << 20);  // from the top of the heap
  ASSERT_NE(block, nullptr);
  std::memset(block, 1, 2 << 20);
  const size_t held = mallinfo2().arena;
  std::free(block);
  EXPECT_EQ(mallinfo2().arena, held) << "the heap's free top went back to the system";
}

// The Trainer's and Fabric's tuning: blocks up to 32 MiB (a model's temporaries and gradients)
// come from the heap from the first step, and a freed top of the heap up to 64 MiB stays there,
// instead of going back to the system and being faulted in again the next step.
TEST(Heap, TrainingServesBlocksBelow32MiBFromTheHeapAndKeepsThem) {
  testing::small_mmap_threshold();
  ASSERT_FALSE(testing::heap_serves(24 << 20));
  tune_heap_for_training();
  EXPECT_TRUE(testing::heap_serves(24 << 20));
  EXPECT_FALSE(testing::heap_serves(40 << 20));
  void* block = std::malloc(24 << 20);
  ASSERT_NE(block, nullptr);
  std::memset(block, 1, 24 << 20);
  const size_t held = mallinfo2().arena;
  std::free(block);
  EXPECT_EQ(mallinfo2().arena, held) << "the heap's free top went back to the system";
}

// Sharded training's tuning also asks for huge pages for LibTorch's blocks of 8 MiB or more: the
// middle of a fresh 16 MiB tensor lies in a mapping the kernel may back with 2 MiB pages, while
// a block malloc maps for anyone else does not (where THP is "madvise").
TEST(Heap, ShardedTrainingAsksForHugePagesForLibTorchsBlocksFromEightMiB) {
  tune_heap_for_sharded_training();
  const int expected = testing::huge_pages_never() ? 0 : 1;
  auto tensor = at::empty({4 << 20}, at::kFloat);
  EXPECT_EQ(testing::huge_pages_eligible(reinterpret_cast<uintptr_t>(tensor.data_ptr()) + (8 << 20)), expected);
  if (testing::huge_pages_setting().find("[madvise]") == std::string::npos) return;
  void* plain = std::malloc(16 << 20);
  ASSERT_NE(plain, nullptr);
  EXPECT_EQ(testing::huge_pages_eligible(reinterpret_cast<uintptr_t>(plain) + (8 << 20)), 0);
  std::free(plain);
}
#endif

}  // namespace
}  // namespace core
}  // namespace lockstep
