#include <lockstep/data/sampler.h>

#include <algorithm>
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
  EXPECT_THROW(DistributedSampler(10, SamplerOptions(2, 0).unrepeated(true).drop_last(true)), UsageError);
  // Every rank refuses, not only the one left empty, so that none waits for it.
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_THROW(DistributedSampler(2, SamplerOptions(3, rank).unrepeated(true)), UsageError) << rank;
  }
}

// 250 examples on 3 ranks: the padded split gives each rank 84, ranks 1 and 2 ending on a repeat
// of the order's first two; the unrepeated split (Lightning's UnrepeatedDistributedSampler) 84,
// 83 and 83, every index once, shuffled or not.
TEST(DistributedSampler, UnrepeatedGivesEveryIndexOnce) {
  for (bool shuffle : {false, true}) {
    std::vector<int64_t> padded_order, unrepeated_order, firsts;
    for (int rank = 0; rank < 3; ++rank) {
      DistributedSampler padded(250, SamplerOptions(3, rank).shuffle(shuffle).seed(5));
      DistributedSampler unrepeated(250, SamplerOptions(3, rank).shuffle(shuffle).seed(5).unrepeated(true));
      EXPECT_EQ(padded.num_samples(), 84);
      EXPECT_EQ(padded.padding(), rank == 0 ? 0 : 1) << rank;
      EXPECT_EQ(padded.total_size(), 252);
      EXPECT_EQ(unrepeated.num_samples(), rank == 0 ? 84 : 83) << rank;
      EXPECT_EQ(unrepeated.padding(), 0);
      EXPECT_EQ(unrepeated.total_size(), 250);
      const auto p = padded.indices(), u = unrepeated.indices();
      ASSERT_EQ(static_cast<int64_t>(u.size()), unrepeated.num_samples());
      EXPECT_TRUE(std::equal(u.begin(), u.end(), p.begin())) << "the same share, less the repeat; rank " << rank;
      firsts.push_back(p.front());  // the epoch order's element `rank`
      if (rank > 0) EXPECT_EQ(p.back(), firsts[static_cast<size_t>(rank - 1)]) << "rank " << rank << " ends on a repeat";
      padded_order.insert(padded_order.end(), p.begin(), p.end());
      unrepeated_order.insert(unrepeated_order.end(), u.begin(), u.end());
    }
    EXPECT_EQ(std::set<int64_t>(unrepeated_order.begin(), unrepeated_order.end()).size(), 250u);
    EXPECT_EQ(unrepeated_order.size(), 250u);
    EXPECT_EQ(padded_order.size(), 252u);
  }
  DistributedSampler even(250, SamplerOptions(2, 1));
  EXPECT_EQ(even.padding(), 0);
  DistributedSampler dropped(250, SamplerOptions(3, 2).drop_last(true));
  EXPECT_EQ(dropped.padding(), 0);
  EXPECT_EQ(dropped.num_samples(), 83);
}

}  // namespace
}  // namespace distributed
}  // namespace lockstep
