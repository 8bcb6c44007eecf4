#include <lockstep/distributed/comm/shard_transport.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include <lockstep/core/error.h>
#include <lockstep/distributed/collectives.h>
#include <lockstep/distributed/comm/shared_memory_shard_transport.h>
#include <torch/torch.h>

#include "../../../support/errors.h"
#include "../../../support/thread_ranks.h"

namespace lockstep {
namespace distributed {
namespace shard_transport_test {
namespace {

using lockstep::testing::error_of;
using lockstep::testing::run_ranks;

std::chrono::milliseconds forever() { return std::chrono::seconds(20); }

// A slot of 64 KiB: 100003 values per rank go through in chunks, 17 in one.
constexpr int64_t kSlotBytes = 64 << 10;
const std::vector<int64_t> kShardSizes = {1, 17, 100003};

// This rank's flat: different on every rank, and sums that are not exact.
at::Tensor values_of(int rank, int64_t n, at::ScalarType dtype) {
  auto generator = at::detail::createCPUGenerator(2000 + rank);
  return at::randn({n}, generator, torch::TensorOptions().dtype(dtype));
}

// ((x0 + x1) + x2 ...) / divisor over the ranks' flats, one element at a time, here.
template <typename T>
at::Tensor rank_order_sum_of(int world, int64_t n, double divisor) {
  const auto dtype = c10::CppTypeToScalarType<T>::value;
  at::Tensor sum = values_of(0, n, dtype).clone();
  T* out = sum.data_ptr<T>();
  for (int r = 1; r < world; ++r) {
    const at::Tensor theirs = values_of(r, n, dtype);
    for (int64_t i = 0; i < n; ++i) out[i] += theirs.data_ptr<T>()[i];
  }
  for (int64_t i = 0; i < n; ++i) out[i] /= static_cast<T>(divisor);
  return sum;
}

at::Tensor rank_order_sum(int world, int64_t n, at::ScalarType dtype, double divisor) {
  return dtype == at::kFloat ? rank_order_sum_of<float>(world, n, divisor) : rank_order_sum_of<double>(world, n, divisor);
}

// Both transports on every rank: shared memory (the choice on one host) and c10d.
struct Both {
  std::shared_ptr<ShardTransport> shared, c10d;
};
Both both_transports(ProcessGroup& g) {
  std::string why;
  Both both{choose_shard_transport(g, kSlotBytes, true, &why), c10d_shard_transport(g)};
  EXPECT_EQ(both.shared->name(), "shared memory") << why;
  EXPECT_EQ(why, "");
  EXPECT_EQ(both.c10d->name(), "gloo");
  return both;
}

class ShardTransports : public ::testing::TestWithParam<int> {};

// Each rank's shard is the rank-order sum of its part, to the bit, through Gloo and through
// shared memory alike; float and double; shards that fit a slot and ones that go in chunks.
TEST_P(ShardTransports, ReduceScatterIsTheRankOrderSumOnBothPaths) {
  const int world = GetParam();
  run_ranks(world, [world](ProcessGroup& g) {
    const auto transports = both_transports(g);
    for (auto dtype : {at::kFloat, at::kDouble}) {
      for (int64_t n : kShardSizes) {
        const auto flat = values_of(g.rank(), world * n, dtype);
        const auto expected = rank_order_sum(world, world * n, dtype, world).narrow(0, g.rank() * n, n);
        auto through_gloo = torch::empty({n}, flat.options());
        auto through_memory = torch::empty({n}, flat.options());
        transports.c10d->reduce_scatter(flat, through_gloo, world, "reduce_scatter test");
        transports.shared->reduce_scatter(flat, through_memory, world, "reduce_scatter test");
        EXPECT_TRUE(through_gloo.equal(expected)) << "gloo, rank " << g.rank() << ", " << dtype << ", n " << n;
        EXPECT_TRUE(through_memory.equal(expected)) << "shared memory, rank " << g.rank() << ", " << dtype << ", n " << n;
        EXPECT_TRUE(flat.equal(values_of(g.rank(), world * n, dtype))) << "the flat must stay as it was";
      }
    }
  }, forever());
}

// A flat given as segments (gradients of parameters, gaps of padding between and after them)
// reduces to the bits of the flat they make, zeros in the gaps, on both paths; segments cross the
// shards' boundaries and, with 100003 values per rank, the slot's chunks.
TEST_P(ShardTransports, SegmentsReduceAsTheFlatTheyMake) {
  const int world = GetParam();
  run_ranks(world, [world](ProcessGroup& g) {
    const auto transports = both_transports(g);
    for (int64_t n : kShardSizes) {
      const int64_t total = world * n;
      auto flat = values_of(g.rank(), total, at::kFloat);
      // Pieces [0, total/3) and [total/2, total - 1): zero at total/3 ... total/2 - 1 and at the end.
      const std::vector<int64_t> offsets{0, total / 2};
      const std::vector<int64_t> sizes{total / 3, total - 1 - total / 2};
      std::vector<at::Tensor> pieces;
      auto expected_flat = torch::zeros({total});
      for (size_t i = 0; i < offsets.size(); ++i) {
        pieces.push_back(flat.narrow(0, offsets[i], sizes[i]).clone());
        expected_flat.narrow(0, offsets[i], sizes[i]).copy_(pieces.back());
      }
      for (const auto& transport : {transports.c10d, transports.shared}) {
        auto from_flat = torch::empty({n});
        auto from_pieces = torch::empty({n});
        transport->reduce_scatter(expected_flat, from_flat, world, "the flat");
        transport->reduce_scatter(FlatSegments(total, pieces, offsets), from_pieces, world, "its pieces");
        EXPECT_TRUE(from_pieces.equal(from_flat)) << transport->name() << ", rank " << g.rank() << ", n " << n;
      }
    }
  }, forever());
}

// reduce_scatter_add (a gradient shard that accumulates) gives the bits of reduce_scatter into
// a new tensor added with add_(), on both paths: float, double and bfloat16, a flat and pieces,
// shards that fit a slot and ones that go in pieces.
TEST_P(ShardTransports, ReduceScatterAddIsReduceScatterThenAdd) {
  const int world = GetParam();
  run_ranks(world, [world](ProcessGroup& g) {
    const auto transports = both_transports(g);
    for (auto dtype : {at::kFloat, at::kDouble, at::kBFloat16}) {
      for (int64_t n : kShardSizes) {
        const int64_t total = world * n;
        const auto flat = values_of(g.rank(), total, at::kFloat).to(dtype);
        const std::vector<int64_t> offsets{0, total / 2};
        const std::vector<at::Tensor> pieces{flat.narrow(0, 0, total / 3).clone(),
                                             flat.narrow(0, total / 2, total - 1 - total / 2).clone()};
        const auto earlier = values_of(100 + g.rank(), n, at::kFloat).to(dtype);
        for (const auto& transport : {transports.c10d, transports.shared}) {
          for (const auto& given : {FlatSegments(flat), FlatSegments(total, pieces, offsets)}) {
            auto part = torch::empty({n}, flat.options());
            transport->reduce_scatter(given, part, world, "reduce_scatter test");
            const auto expected = earlier.clone().add_(part);
            auto kept = earlier.clone();
            transport->reduce_scatter_add(given, kept, world, "reduce_scatter_add test");
            EXPECT_TRUE(kept.equal(expected)) << transport->name() << ", rank " << g.rank() << ", " << dtype
                                              << ", n " << n << ", " << given.tensors.size() << " piece(s)";
          }
        }
      }
    }
  }, forever());
}

// reduce_scatter then all_gather is the whole sum on every rank; the shard may be this rank's
// part of the flat it gathers into.
TEST_P(ShardTransports, AllGatherRoundTrip) {
  const int world = GetParam();
  run_ranks(world, [world](ProcessGroup& g) {
    const auto transports = both_transports(g);
    for (const auto& transport : {transports.c10d, transports.shared}) {
      for (auto dtype : {at::kFloat, at::kDouble}) {
        for (int64_t n : kShardSizes) {
          const auto expected = rank_order_sum(world, world * n, dtype, 1.0);
          auto shard = torch::empty({n}, torch::TensorOptions().dtype(dtype));
          transport->reduce_scatter(values_of(g.rank(), world * n, dtype), shard, 1.0, "round trip");
          auto gathered = torch::full({world * n}, -1.0, shard.options());
          transport->all_gather(shard, gathered, "round trip");
          EXPECT_TRUE(gathered.equal(expected)) << transport->name() << ", rank " << g.rank() << ", n " << n;
          auto in_place = torch::zeros({world * n}, shard.options());
          auto own_part = in_place.narrow(0, g.rank() * n, n);
          own_part.copy_(shard);
          transport->all_gather(own_part, in_place, "round trip in place");
          EXPECT_TRUE(in_place.equal(expected)) << transport->name() << " in place, rank " << g.rank() << ", n " << n;
        }
      }
    }
  }, forever());
}

// The last rank stays connected but never calls: the others fail within the timeout, naming the
// call and themselves (and, in shared memory, the missing rank); later calls fail at once.
TEST_P(ShardTransports, ARankThatNeverCallsIsNamedWithinTheTimeout) {
  const int world = GetParam();
  for (const bool shared : {false, true}) {
    std::vector<std::string> messages(world);
    std::atomic<int> finished{0};
    ::testing::internal::CaptureStderr();  // Gloo's "still waiting" lines
    const auto start = std::chrono::steady_clock::now();
    run_ranks(world, [&](ProcessGroup& g) {
      auto transport = shared ? choose_shard_transport(g, kSlotBytes, true, nullptr) : c10d_shard_transport(g);
      if (g.rank() == world - 1) {
        while (finished < world - 1) std::this_thread::sleep_for(std::chrono::milliseconds(10));
        return;
      }
      auto shard = torch::empty({8});
      auto flat = torch::ones({8 * world});
      messages[g.rank()] = error_of<DistributedError>(
          [&] { transport->reduce_scatter(flat, shard, 1.0, "reduce_scatter of unit 3's gradients"); });
      if (shared) {
        EXPECT_NE(error_of<DistributedError>([&] { transport->all_gather(shard, flat, "all_gather of unit 4"); })
                      .find("all_gather of unit 4 through shared memory: an earlier call failed"),
                  std::string::npos);
      }
      ++finished;
    }, std::chrono::milliseconds(1000));
    ::testing::internal::GetCapturedStderr();
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(8)) << "shared " << shared;
    // In shared memory the first rank to time out stops the others at once; each names the missing rank.
    const std::string missing = std::to_string(world - 1);
    int timed_out = 0;
    for (int r = 0; r < world - 1; ++r) {
      const auto& m = messages[r];
      EXPECT_NE(m.find("rank " + std::to_string(r) + "/" + std::to_string(world) + ": reduce_scatter of unit 3's "
                       "gradients"), std::string::npos) << m;
      if (shared) {
        EXPECT_NE(m.find("waiting for rank(s) " + missing + " (flats written, barrier 1)"), std::string::npos) << m;
        timed_out += m.find("timed out after 1 s") != std::string::npos;
      } else {
        EXPECT_NE(m.find("did not complete (timeout 1 s)"), std::string::npos) << m;
      }
    }
    if (shared) EXPECT_GE(timed_out, 1) << messages[0];
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ShardTransports, ::testing::Values(2, 3, 4),
                         [](const auto& info) { return "ranks" + std::to_string(info.param); });

TEST(ShardTransportChoice, SharedMemoryIsRefusedWithTheReason) {
  run_ranks(1, [](ProcessGroup& g) {
    std::string why;
    EXPECT_EQ(choose_shard_transport(g, kSlotBytes, true, &why)->name(), "gloo");
    EXPECT_EQ(why, "a single rank has nothing to share");
  }, forever());
  run_ranks(2, [](ProcessGroup& g) {
    std::string why;
    EXPECT_EQ(choose_shard_transport(g, kSlotBytes, false, &why)->name(), "gloo");
    EXPECT_EQ(why, "turned off by the caller (ranks 0, 1)");
  }, forever());
  setenv("LOCKSTEP_DDP_SHARED_MEMORY", "0", 1);
  run_ranks(2, [](ProcessGroup& g) {
    std::string why;
    EXPECT_EQ(choose_shard_transport(g, kSlotBytes, true, &why)->name(), "gloo");
    EXPECT_EQ(why, "turned off by LOCKSTEP_DDP_SHARED_MEMORY=0 (ranks 0, 1)");
  }, forever());
  unsetenv("LOCKSTEP_DDP_SHARED_MEMORY");
  // Several hosts (named here, all in this process): c10d, whatever their layout.
  const std::vector<std::string> hosts = {"a", "a", "b", "b"};
  run_ranks(4, [&](ProcessGroup& g) {
    std::string why;
    EXPECT_FALSE(SharedMemoryShardTransport::connect(g, kSlotBytes, "", &why, hosts[g.rank()]));
    EXPECT_EQ(why, "ranks on 2 hosts (ranks 0, 1, 2, 3)");
  }, forever());
}

// Shared memory takes CPU float32, float64 and bfloat16; other tensors go through c10d on every rank.
TEST(SharedMemoryShardTransport, OtherDtypesGoThroughC10d) {
  run_ranks(2, [](ProcessGroup& g) {
    auto transport = choose_shard_transport(g, kSlotBytes, true, nullptr);
    ASSERT_EQ(transport->name(), "shared memory");
    auto shard = torch::empty({3}, torch::kInt64);
    transport->reduce_scatter(torch::arange(6, torch::kInt64) * (g.rank() + 1), shard, 1.0, "integers");
    EXPECT_TRUE(shard.equal(torch::arange(3 * g.rank(), 3 * g.rank() + 3, torch::kInt64) * 3)) << shard;
  }, forever());
}

// bfloat16 goes through shared memory too, summed and divided in float32 and rounded once: the
// same bits as the c10d path (which moves it through Gloo as float16 bits) and as a float32 sum.
TEST(SharedMemoryShardTransport, Bfloat16IsSummedInFloat32OnBothPaths) {
  constexpr int kWorld = 3;
  constexpr int64_t kShard = 5000;
  std::vector<at::Tensor> flats;
  for (int r = 0; r < kWorld; ++r) {
    auto gen = at::detail::createCPUGenerator(7 + r);
    flats.push_back(torch::randn({kWorld * kShard}, gen).to(torch::kBFloat16));
  }
  const auto sum = ((flats[0].to(torch::kFloat) + flats[1] + flats[2]) / kWorld).to(torch::kBFloat16);
  run_ranks(kWorld, [&](ProcessGroup& g) {
    auto memory = choose_shard_transport(g, kSlotBytes, true, nullptr);
    ASSERT_EQ(memory->name(), "shared memory");
    const auto expected = sum.narrow(0, g.rank() * kShard, kShard);
    for (const auto& transport : {memory, c10d_shard_transport(g)}) {
      auto shard = torch::empty({kShard}, torch::kBFloat16);
      transport->reduce_scatter(flats[g.rank()], shard, kWorld, "bfloat16 gradients");
      EXPECT_TRUE(shard.equal(expected)) << transport->name();
      auto whole = torch::empty({kWorld * kShard}, torch::kBFloat16);
      transport->all_gather(shard, whole, "bfloat16 parameters");
      EXPECT_TRUE(whole.equal(sum)) << transport->name();
    }
  }, forever());
}

TEST(SharedMemoryShardTransport, UnequalShardsAreUsageErrors) {
  run_ranks(2, [](ProcessGroup& g) {
    for (const auto& transport : {choose_shard_transport(g, kSlotBytes, true, nullptr), c10d_shard_transport(g)}) {
      auto shard = torch::empty({4});
      const auto message = error_of<UsageError>([&] { transport->reduce_scatter(torch::ones({7}), shard, 1.0, "unit 0"); });
      EXPECT_NE(message.find(": reduce_scatter (unit 0): flat has 7 elements and shard 4, but flat must hold "
                             "world_size (2) equal shards"), std::string::npos) << message;
    }
  }, forever());
}

TEST(SharedMemoryShardTransport, PiecesOutOfOrderAreUsageErrors) {
  run_ranks(2, [](ProcessGroup& g) {
    for (const auto& transport : {choose_shard_transport(g, kSlotBytes, true, nullptr), c10d_shard_transport(g)}) {
      auto shard = torch::empty({4});
      const FlatSegments overlapping(8, {torch::ones({3}), torch::ones({3})}, {0, 2});
      const auto message = error_of<UsageError>([&] { transport->reduce_scatter(overlapping, shard, 1.0, "unit 2"); });
      EXPECT_NE(message.find(": reduce_scatter (unit 2): segment 1 (elements 2 to 5) overlaps the one before it"),
                std::string::npos) << message;
      const FlatSegments wrong_dtype(8, {torch::ones({3}, torch::kDouble)}, {0});
      EXPECT_THROW(transport->reduce_scatter(wrong_dtype, shard, 1.0, "unit 2"), UsageError);
    }
  }, forever());
}

// Ranks in different calls fail naming both, instead of mixing their data.
TEST(SharedMemoryShardTransport, RanksInDifferentCallsFailNamingBoth) {
  std::vector<std::string> messages(2);
  run_ranks(2, [&](ProcessGroup& g) {
    auto transport = choose_shard_transport(g, kSlotBytes, true, nullptr);
    ASSERT_EQ(transport->name(), "shared memory");
    auto flat = torch::ones({8});
    auto shard = torch::empty({4});
    messages[g.rank()] = error_of<DistributedError>([&] {
      if (g.rank() == 0) transport->reduce_scatter(flat, shard, 1.0, "unit 1 gradients");
      if (g.rank() == 1) transport->all_gather(shard, flat, "unit 1 parameters");
    });
  }, forever());
  EXPECT_NE(messages[0].find("rank 0/2: unit 1 gradients through shared memory: ranks are in different calls: rank 0 in "
                             "reduce_scatter of 4 Float values per rank, rank 1 in all_gather of 4 Float values per rank"),
            std::string::npos) << messages[0];
  EXPECT_NE(messages[1].find("rank 1 in all_gather of 4 Float values per rank, rank 0 in reduce_scatter"),
            std::string::npos) << messages[1];
}

// A peer whose transport is gone (an error in its step) is named at the next 20 ms wait slice,
// not after the 20 s timeout.
TEST(SharedMemoryShardTransport, APeerThatLeftIsNamedLongBeforeTheTimeout) {
  std::string message;
  std::chrono::steady_clock::duration waited{};
  run_ranks(2, [&](ProcessGroup& g) {
    auto transport = choose_shard_transport(g, kSlotBytes, true, nullptr);
    ASSERT_EQ(transport->name(), "shared memory");
    barrier(g, "connected");
    if (g.rank() == 1) {
      transport.reset();
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    auto flat = torch::ones({8});
    message = error_of<DistributedError>([&] { transport->all_gather(flat.narrow(0, 0, 4), flat, "unit 2 parameters"); });
    waited = std::chrono::steady_clock::now() - start;
  }, forever());
  EXPECT_LT(waited, std::chrono::seconds(5));
  EXPECT_NE(message.find("rank 0/2: unit 2 parameters through shared memory: rank(s) 1 left the reduction"),
            std::string::npos) << message;
}

}  // namespace
}  // namespace shard_transport_test
}  // namespace distributed
}  // namespace lockstep
