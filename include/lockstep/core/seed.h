#pragma once
/// seed_everything: one seed for every random generator Lockstep and LibTorch use.

#include <cstdint>

namespace lockstep {

/// Seeds LibTorch's default CPU generator (and CUDA's, when present) and the C library's
/// rand(), and sets LOCKSTEP_GLOBAL_SEED so processes started later seed the same way.
void seed_everything(uint64_t seed);

}  // namespace lockstep
