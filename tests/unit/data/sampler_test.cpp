#include <lockstep/data/sampler.h>

#include <set>
#include <sstream>

#include <gtest/gtest.h>

#include <lockstep/core/error.h>

#include "../../support/command.h"
#include "../../support/paths.h"

namespace lockstep {
namespace distributed {
namespace {

struct Case {
  int64_t size;
  int replicas;
  bool shuffle;
  bool drop_last;
  int64_t seed;
  int64_t epoch;
};

std::string python_indices(const Case& c) {
  std::ostringstream script;
  script << "import torch\n"
         << "from torch.utils.data import DistributedSampler\n"
         << "for rank in range(" << c.replicas << "):\n"
         << "    s = DistributedSampler(range(" << c.size << "), num_replicas=" << c.replicas
         << ", rank=rank, shuffle=" << (c.shuffle ? "True" : "False") << ", seed=" << c.seed
         << ", drop_last=" << (c.drop_last ? "True" : "False") << ")\n"
         << "    s.set_epoch(" << c.epoch << ")\n"
         << "    print(' '.join(str(i) for i in s))\n";
  auto result = testing::run_command({LOCKSTEP_TEST_PYTHON, "-c", script.str()}, {{"PATH", "/usr/bin:/bin"}},
                                     std::chrono::seconds(60));
  EXPECT_EQ(result.exit_code, 0) << result.err;
  return result.out;
}

std::string ours(const Case& c) {
  std::ostringstream out;
  for (int rank = 0; rank < c.replicas; ++rank) {
    DistributedSampler sampler(c.size, SamplerOptions(c.replicas, rank).shuffle(c.shuffle).seed(c.seed).drop_last(c.drop_last));
    sampler.set_epoch(c.epoch);
    const auto indices = sampler.indices();
    for (size_t i = 0; i < indices.size(); ++i) out << (i ? " " : "") << indices[i];
    out << "\n";
  }
  return out.str();
}

TEST(DistributedSampler, SameIndicesAsPyTorch) {
  if (!std::filesystem::exists(LOCKSTEP_TEST_PYTHON)) GTEST_SKIP() << "no " << LOCKSTEP_TEST_PYTHON << " with torch";
  const std::vector<Case> cases = {
      {10, 3, true, false, 7, 2},  {10, 3, true, true, 7, 2},   {10, 3, false, false, 0, 0},
      {2, 4, true, false, 1, 0},   {60000, 2, true, false, 42, 5}, {13, 2, false, true, 0, 1},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(ours(cases[i]), python_indices(cases[i])) << "case " << i;
  }
}

TEST(DistributedSampler, RanksPartitionTheEpochAndShuffleChangesWithEpoch) {
  std::multiset<int64_t> seen;
  for (int rank = 0; rank < 4; ++rank) {
    DistributedSampler s(100, SamplerOptions(4, rank).seed(3));
    s.set_epoch(1);
    EXPECT_EQ(s.num_samples(), 25);
    for (auto i : s.indices()) seen.insert(i);
  }
  EXPECT_EQ(seen.size(), 100u);
  EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), 100u);
  DistributedSampler a(100, SamplerOptions(1, 0));
  auto epoch0 = a.indices();
  a.set_epoch(1);
  EXPECT_NE(epoch0, a.indices());
}

TEST(DistributedSampler, BadOptionsAreUsageErrors) {
  EXPECT_THROW(DistributedSampler(10, SamplerOptions(2, 2)), UsageError);
  EXPECT_THROW(DistributedSampler(1, SamplerOptions(2, 0).drop_last(true)), UsageError);
}

}  // namespace
}  // namespace distributed
}  // namespace lockstep
