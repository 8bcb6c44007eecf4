#include <lockstep/core/seed.h>

#include <cstdlib>
#include <string>

#include <torch/torch.h>

namespace lockstep {

void seed_everything(uint64_t seed) {
  torch::manual_seed(seed);
  std::srand(static_cast<unsigned>(seed));
  ::setenv("LOCKSTEP_GLOBAL_SEED", std::to_string(seed).c_str(), 1);
}

}  // namespace lockstep
