#pragma once
/// seed_everything: one seed for every random generator Lockstep and LibTorch use.

#include <cstdint>
#include <optional>

namespace lockstep {

/// Seeds LibTorch's default CPU generator (and CUDA's, when present) and the C library's
/// rand(), and sets LOCKSTEP_GLOBAL_SEED so processes started later seed the same way.
void seed_everything(uint64_t seed);

/// The seed seed_everything (or `--seed`) gave this process or the one that started it
/// (LOCKSTEP_GLOBAL_SEED), or nullopt when none did. A loader without a seed of its own shuffles
/// with it, as Lightning's samplers take PL_GLOBAL_SEED.
std::optional<uint64_t> global_seed();

}  // namespace lockstep
