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

std::optional<uint64_t> global_seed() {
  const char* text = std::getenv("LOCKSTEP_GLOBAL_SEED");
  if (text == nullptr || *text == '\0') return std::nullopt;
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text, &end, 10);
  if (*end != '\0' || *text == '-') return std::nullopt;  // not one that seed_everything set
  return static_cast<uint64_t>(value);
}

}  // namespace lockstep
