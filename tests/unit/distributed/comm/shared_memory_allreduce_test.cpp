#include <lockstep/distributed/comm/shared_memory_allreduce.h>

#include <time.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <lockstep/core/error.h>
#include <torch/torch.h>

#include <lockstep/distributed/collectives.h>
#include <lockstep/distributed/ddp/ddp.h>

#include "../../../support/command.h"
#include "../../../support/errors.h"
#include "../../../support/parity.h"
#include "../../../support/paths.h"
#include "../../../support/thread_ranks.h"

namespace lockstep {
namespace distributed {
namespace shared_memory_allreduce_test {
namespace {

using lockstep::testing::run_ranks;

std::chrono::milliseconds forever() { return std::chrono::seconds(20); }

at::Tensor reduced(const c10::intrusive_ptr<c10::ivalue::Future>& future) {
  future->wait();
  if (future->hasError()) throw DistributedError(future->tryRetrieveErrorMessage());
  return future->value().toTensor();
}

// This rank's values: different on every rank, and not exactly representable sums.
at::Tensor values_of(int rank, int64_t n, at::ScalarType dtype) {
  auto generator = at::detail::createCPUGenerator(1000 + rank);
  return at::randn({n}, generator, torch::TensorOptions().dtype(dtype));
}

class SharedMemorySum : public ::testing::TestWithParam<int> {};

// The mean equals the sum in rank order divided by the world size, to the bit, in place and
// through a copy, for sizes that do not split evenly into the ranks' parts; on 2 ranks it is
// also Gloo's result to the bit.
TEST_P(SharedMemorySum, IsTheRankOrderSumOnEveryRank) {
  const int world = GetParam();
  run_ranks(world, [world](ProcessGroup& g) {
    std::string why;
    auto shared = SharedMemoryAllreduce::connect(g, 4 << 20, "", &why);
    ASSERT_TRUE(shared) << why;
    int64_t offset = 0;
    for (auto dtype : {at::kFloat, at::kDouble}) {
      for (int64_t n : {1, 17, 1000, 100003}) {
        const auto mine = values_of(g.rank(), n, dtype);
        auto expected = torch::zeros({n}, mine.options());
        for (int r = 0; r < world; ++r) expected.add_(values_of(r, n, dtype));
        expected.div_(world);
        auto region = shared->region(offset, n, mine.options());
        region.copy_(mine);
        auto in_place = reduced(shared->allreduce(offset, region, world));
        EXPECT_EQ(in_place.data_ptr(), region.data_ptr());
        EXPECT_TRUE(in_place.equal(expected)) << "rank " << g.rank() << " n " << n;
        auto copy = mine.clone();
        EXPECT_TRUE(reduced(shared->allreduce(offset, copy, world)).equal(expected)) << "copied, n " << n;
        if (world == 2) {
          auto gloo = all_reduce(g, mine.clone(), ReduceOp::sum).div_(world);
          EXPECT_TRUE(gloo.equal(in_place)) << "Gloo's sum differs, n " << n;
        }
        offset += (n * mine.element_size() + 63) / 64 * 64;
      }
    }
  }, forever());
}

// allreduce_here (DDP's last bucket) runs on the calling thread after the calls queued before it:
// both have completed when it returns, with the same bits as allreduce.
TEST_P(SharedMemorySum, HereRunsAfterTheQueuedCallsWithTheSameBits) {
  const int world = GetParam();
  run_ranks(world, [world](ProcessGroup& g) {
    std::string why;
    auto shared = SharedMemoryAllreduce::connect(g, 4 << 20, "", &why);
    ASSERT_TRUE(shared) << why;
    const int64_t n = 100003, second = (n * 4 + 63) / 64 * 64;
    const auto mine = values_of(g.rank(), n, at::kFloat);
    auto expected = torch::zeros({n});
    for (int r = 0; r < world; ++r) expected.add_(values_of(r, n, at::kFloat));
    expected.div_(world);
    for (int step = 0; step < 3; ++step) {
      auto first = shared->region(0, n, mine.options()).copy_(mine);
      auto last = shared->region(second, n, mine.options()).copy_(mine);
      auto queued = shared->allreduce(0, first, world);
      auto here = shared->allreduce_here(second, last, world);
      EXPECT_TRUE(here->completed());
      EXPECT_TRUE(queued->completed()) << "the call queued before it ends first";
      EXPECT_TRUE(reduced(here).equal(expected)) << "rank " << g.rank() << " step " << step;
      EXPECT_TRUE(reduced(queued).equal(expected)) << "rank " << g.rank() << " step " << step;
    }
  }, forever());
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, SharedMemorySum, ::testing::Values(2, 3, 4));

// allreduce_here polls a little before it sleeps (a CPU with nothing to do should not halt), but
// never for long: a rank that waits 300 ms for a late peer spends a small part of it on its CPU.
TEST(SharedMemoryAllreduce, HereSleepsWhileALatePeerComes) {
  std::atomic<bool> zero_calls{false};  // rank 1's 300 ms start when rank 0 is about to wait
  run_ranks(2, [&zero_calls](ProcessGroup& g) {
    std::string why;
    auto shared = SharedMemoryAllreduce::connect(g, 1 << 20, "", &why);
    ASSERT_TRUE(shared) << why;
    auto mine = shared->region(0, 16, torch::kFloat32).fill_(static_cast<float>(g.rank()));
    if (g.rank() == 1) {
      while (!zero_calls.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
    const auto cpu_seconds = [] {
      timespec t{};
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
      return static_cast<double>(t.tv_sec) + t.tv_nsec / 1e9;
    };
    const double cpu_before = cpu_seconds();
    const auto before = std::chrono::steady_clock::now();
    if (g.rank() == 0) zero_calls.store(true);
    EXPECT_TRUE(reduced(shared->allreduce_here(0, mine, 2)).equal(torch::full({16}, 0.5f)));
    if (g.rank() == 0) {
      EXPECT_GE(std::chrono::steady_clock::now() - before, std::chrono::milliseconds(200)) << "it waited for rank 1";
      EXPECT_LT(cpu_seconds() - cpu_before, 0.1) << "seconds on the CPU while it waited";
    }
  }, forever());
}

// Several hosts (named here, all in this process): each host sums in its shared memory, then
// rank i of every host sums part i across hosts over Gloo. Every rank gets the same bits: the
// hosts' sums (each in rank order) added in host order, divided by the world size.
class SharedMemoryHosts : public ::testing::TestWithParam<std::vector<std::string>> {};

TEST_P(SharedMemoryHosts, SumWithinEachHostThenAcrossHosts) {
  const auto hosts = GetParam();
  const int world = static_cast<int>(hosts.size());
  run_ranks(world, [&](ProcessGroup& g) {
    std::string why;
    auto shared = SharedMemoryAllreduce::connect(g, 1 << 20, "", &why, hosts[g.rank()]);
    ASSERT_TRUE(shared) << why;
    EXPECT_EQ(shared->describe(), "shared memory within each host, gloo across 2 hosts");
    for (int64_t n : {1, 1000, 65537}) {
      std::vector<std::string> order;  // hosts in order of their first rank
      for (const auto& h : hosts) {
        if (std::find(order.begin(), order.end(), h) == order.end()) order.push_back(h);
      }
      at::Tensor expected;
      for (const auto& h : order) {
        auto host_sum = torch::zeros({n});
        for (int r = 0; r < world; ++r) {
          if (hosts[r] == h) host_sum.add_(values_of(r, n, at::kFloat));
        }
        expected = expected.defined() ? expected + host_sum : host_sum;
      }
      expected.div_(world);
      auto region = shared->region(0, n, torch::kFloat);
      region.copy_(values_of(g.rank(), n, at::kFloat));
      EXPECT_TRUE(reduced(shared->allreduce(0, region, world)).equal(expected)) << "rank " << g.rank() << " n " << n;
    }
  }, forever());
}

INSTANTIATE_TEST_SUITE_P(Layouts, SharedMemoryHosts,
                         ::testing::Values(std::vector<std::string>{"a", "a", "b", "b"},
                                           std::vector<std::string>{"a", "b", "a", "b"},
                                           std::vector<std::string>{"a", "a", "a", "b", "b", "b"}));

TEST(SharedMemoryAllreduce, HostsItCannotServeAreRefusedOnEveryRank) {
  for (const auto& [hosts, reason] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"a", "b"}, "no other rank on its host (ranks 0, 1)"},
           {{"a", "a", "b"}, "hosts with different numbers of ranks (ranks 0, 1, 2)"}}) {
    run_ranks(static_cast<int>(hosts.size()), [&, hosts = hosts, reason = reason](ProcessGroup& g) {
      std::string why;
      EXPECT_FALSE(SharedMemoryAllreduce::connect(g, 4096, "", &why, hosts[g.rank()]));
      EXPECT_EQ(why, reason);
    }, forever());
  }
}

TEST(SharedMemoryAllreduce, ARankThatNeverArrivesIsATimeoutNamingIt) {
  std::string message;
  std::atomic<bool> done{false};
  run_ranks(2, [&](ProcessGroup& g) {
    auto shared = SharedMemoryAllreduce::connect(g, 4096);
    ASSERT_TRUE(shared);
    if (g.rank() == 1) {  // stays connected but never reduces
      while (!done) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      return;
    }
    const struct Done { std::atomic<bool>& flag; ~Done() { flag = true; } } finished{done};
    message = lockstep::testing::error_of<DistributedError>([&] { reduced(shared->allreduce(0, torch::ones({8}), 2)); });
    // The transport is broken from now on: later calls fail at once with the same story.
    EXPECT_NE(lockstep::testing::error_of<DistributedError>([&] { reduced(shared->allreduce(0, torch::ones({8}), 2)); })
                  .find("waiting for rank(s) 1"),
              std::string::npos);
  }, std::chrono::milliseconds(400));
  EXPECT_NE(message.find("rank 0/2"), std::string::npos) << message;
  EXPECT_NE(message.find("timed out after 0.4 s waiting for rank(s) 1"), std::string::npos) << message;
}

TEST(SharedMemoryAllreduce, AnyRankRefusingMeansNoRankUsesIt) {
  run_ranks(3, [](ProcessGroup& g) {
    std::string why;
    auto shared = SharedMemoryAllreduce::connect(g, 4096, g.rank() == 2 ? "parameters not on the CPU" : "", &why);
    EXPECT_FALSE(shared) << "rank " << g.rank();
    EXPECT_EQ(why, "parameters not on the CPU (rank 2)");
  }, forever());
  run_ranks(2, [](ProcessGroup& g) {
    std::string why;
    EXPECT_FALSE(SharedMemoryAllreduce::connect(g, 4096, "turned off", &why));
    EXPECT_EQ(why, "turned off (ranks 0, 1)");
  }, forever());
}

TEST(SharedMemoryAllreduce, BadRegionsAndTensorsAreRejected) {
  run_ranks(2, [](ProcessGroup& g) {
    auto shared = SharedMemoryAllreduce::connect(g, 4096);
    ASSERT_TRUE(shared);
    EXPECT_NE(lockstep::testing::error_of<UsageError>([&] { shared->region(32, 4, torch::kFloat); })
                  .find("not a 64-byte aligned part"),
              std::string::npos);
    EXPECT_NE(lockstep::testing::error_of<UsageError>([&] { shared->region(0, 2048, torch::kFloat); })
                  .find("4096-byte slot"),
              std::string::npos);
    EXPECT_NE(lockstep::testing::error_of<UsageError>([&] { shared->allreduce(0, torch::ones({4}, torch::kInt32), 2); })
                  .find("only contiguous float32 and float64"),
              std::string::npos);
  }, forever());
}

// A peer process that exits is noticed within a fraction of a second, long before the timeout.
TEST(SharedMemoryAllreduce, APeerThatExitedIsNamedBeforeTheTimeout) {
  const auto listing = [] {
    std::set<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) names.insert(entry.path().string());
    return names;
  };
  const auto before = listing();
  const auto result = lockstep::testing::run_command(
      {std::string(LOCKSTEP_BIN_DIR) + "/../tests/shared_memory_peer_exit"}, {}, std::chrono::seconds(60));
  EXPECT_EQ(listing(), before) << "the segment must not leave files in /dev/shm";
  EXPECT_EQ(result.exit_code, 0) << result.out << result.err;
  EXPECT_NE(result.out.find("rank 0/2: shared-memory allreduce of a DDP bucket"), std::string::npos) << result.out;
  EXPECT_NE(result.out.find("rank(s) 1 exited"), std::string::npos) << result.out;
  EXPECT_EQ(result.out.find("timed out"), std::string::npos) << result.out;
}

// The last rank to arrive dies before it releases the barrier: every rank has arrived, so the
// survivor must look at the arrived ranks' liveness too, not wait out the timeout.
TEST(SharedMemoryAllreduce, APeerThatDiesInsideTheBarrierIsNamed) {
  const auto start = std::chrono::steady_clock::now();
  const auto result = lockstep::testing::run_command(
      {std::string(LOCKSTEP_BIN_DIR) + "/../tests/shared_memory_peer_exit", "inside-barrier"}, {},
      std::chrono::seconds(60));
  EXPECT_EQ(result.exit_code, 0) << result.out << result.err;
  EXPECT_NE(result.out.find("rank(s) 1 exited (gradients written, barrier 1)"), std::string::npos) << result.out;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30)) << "the 60 s timeout ran out";
}

// A peer whose process lives on but that stopped reducing (its DDP destroyed, an exception in
// its training step) is named at once (the next 20 ms wait slice), not after the group timeout (20 s).
TEST(SharedMemoryAllreduce, APeerThatLeftAliveIsNamedLongBeforeTheTimeout) {
  std::string message;
  std::chrono::steady_clock::duration waited{};
  run_ranks(2, [&](ProcessGroup& g) {
    auto shared = SharedMemoryAllreduce::connect(g, 4096);
    ASSERT_TRUE(shared);
    barrier(g, "connected");
    if (g.rank() == 1) {
      shared.reset();  // leaves; this thread (its "process") goes on
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    message = lockstep::testing::error_of<DistributedError>([&] { reduced(shared->allreduce(0, torch::ones({8}), 2)); });
    waited = std::chrono::steady_clock::now() - start;
  }, forever());
  // Seen at the next 20 ms wait slice; bounded far below the 20 s timeout so load cannot flake it.
  std::cout << "[ left ] named after " << std::chrono::duration<double>(waited).count() << " s\n";
  EXPECT_LT(waited, std::chrono::seconds(5));
  EXPECT_NE(message.find("rank 0/2: shared-memory allreduce of a DDP bucket: rank(s) 1 left the reduction"),
            std::string::npos) << message;
}

// The same through DDP: rank 1's DistributedDataParallel is destroyed (as an exception in its
// training step would) while rank 0 reduces.
TEST(DDPSharedMemory, ARankWhoseDDPIsGoneIsNamedLongBeforeTheTimeout) {
  std::string message;
  std::chrono::steady_clock::duration waited{};
  run_ranks(2, [&](ProcessGroup& g) {
    lockstep::testing::ParityMlp model;
    auto ddp = make_ddp(model, g);
    ASSERT_EQ(ddp->reducer().transport().name(), "shared memory");
    barrier(g, "built");
    if (g.rank() == 1) {
      ddp.reset();
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    message = lockstep::testing::error_of<DistributedError>([&] { ddp->forward(torch::ones({2, 8})).sum().backward(); });
    waited = std::chrono::steady_clock::now() - start;
  }, forever());
  std::cout << "[ DDP gone ] named after " << std::chrono::duration<double>(waited).count() << " s\n";
  EXPECT_LT(waited, std::chrono::seconds(5));
  EXPECT_NE(message.find("rank(s) 1 left the reduction"), std::string::npos) << message;
  EXPECT_EQ(message.find("timed out"), std::string::npos) << message;
}

// Ranks of one host that disagree on the segment's size are refused at connect (fstat), never
// mapped past the end of the memfd (SIGBUS at the first touch).
TEST(SharedMemoryAllreduce, ASegmentOfTheWrongSizeIsRefused) {
  run_ranks(2, [](ProcessGroup& g) {
    std::string why;
    EXPECT_FALSE(SharedMemoryAllreduce::connect(g, g.rank() == 0 ? 4096 : 3 * 4096, "", &why));
    EXPECT_NE(why.find("its host's segment holds "), std::string::npos) << why;
    EXPECT_NE(why.find("bytes (ranks of one host disagree on the buckets' size)"), std::string::npos) << why;
    EXPECT_NE(why.find("(rank 1)"), std::string::npos) << why;
  }, forever());
}

// Ranks in different reductions (another offset, size or dtype) fail naming both sides instead
// of mixing their data.
TEST(SharedMemoryAllreduce, RanksInDifferentReductionsFailNamingBoth) {
  std::vector<std::string> messages(2);
  run_ranks(2, [&](ProcessGroup& g) {
    auto shared = SharedMemoryAllreduce::connect(g, 4096);
    ASSERT_TRUE(shared);
    const int64_t offset = g.rank() == 0 ? 0 : 64;
    messages[g.rank()] = lockstep::testing::error_of<DistributedError>(
        [&] { reduced(shared->allreduce(offset, torch::ones({8}), 2)); });
  }, forever());
  EXPECT_NE(messages[0].find("ranks reduce different buckets: rank 0 has offset 0, 8 Float values, rank 1 has "
                             "offset 64, 8 Float values"), std::string::npos) << messages[0];
  EXPECT_NE(messages[1].find("rank 1 has offset 64, 8 Float values, rank 0 has offset 0"), std::string::npos)
      << messages[1];
}

// ---- DDP over shared memory -------------------------------------------------------------------

// When shared memory is refused, rank 0 says so once, with the transport used instead.
TEST(DDPSharedMemory, RankZeroSaysOnceWhyNotSharedMemory) {
  ::testing::internal::CaptureStderr();
  run_ranks(3, [](ProcessGroup& g) {
    lockstep::testing::ParityMlp first, second;
    DistributedDataParallel a(first, g, DDPOptions().shared_memory(false));
    DistributedDataParallel b(second, g, DDPOptions().shared_memory(false));
  }, forever());
  const std::string err = ::testing::internal::GetCapturedStderr();
  const std::string line =
      "lockstep: DDP averages gradients through gloo, not shared memory: turned off in DDPOptions (ranks 0, 1, 2).\n";
  const auto at = err.find(line);
  EXPECT_NE(at, std::string::npos) << err;
  EXPECT_EQ(err.find(line, at + 1), std::string::npos) << "said more than once: " << err;
}

// Trains 2 ranks for a few steps and returns rank 0's parameters.
std::vector<at::Tensor> train_two_ranks(bool shared_memory, bool view, std::string* transport) {
  using lockstep::testing::ParityMlp;
  torch::manual_seed(3);
  ParityMlp init;
  const auto initial = lockstep::testing::clone_all(init->parameters());
  const lockstep::testing::ParityData data(6, 2 * 4);
  std::vector<at::Tensor> out;
  run_ranks(2, [&](ProcessGroup& g) {
    ParityMlp model;
    lockstep::testing::copy_into(model->parameters(), initial);
    DistributedDataParallel ddp(model, g, DDPOptions().shared_memory(shared_memory).gradient_as_bucket_view(view)
                                              .bucket_cap_mb(0.0005).first_bucket_mb(0.0002));
    torch::optim::Adam opt(ddp.parameters(), 1e-2);
    for (int s = 0; s < 6; ++s) {  // step 2 rebuilds the buckets in arrival order
      opt.zero_grad();
      torch::mse_loss(ddp.forward(data.input(s, g.rank(), 4)), data.target(s, g.rank(), 4)).backward();
      opt.step();
    }
    if (g.rank() == 0) {
      out = lockstep::testing::clone_all(model->parameters());
      *transport = ddp.why_not_shared_memory().empty() ? ddp.reducer().transport().name() : ddp.why_not_shared_memory();
    }
  }, forever());
  return out;
}

TEST(DDPSharedMemory, TrainsToTheSameBitsAsGloo) {
  for (bool view : {false, true}) {
    std::string shm_transport, gloo_transport;
    const auto shm = train_two_ranks(true, view, &shm_transport);
    const auto gloo = train_two_ranks(false, view, &gloo_transport);
    EXPECT_EQ(shm_transport, "shared memory");
    EXPECT_EQ(gloo_transport, "turned off in DDPOptions (ranks 0, 1)");
    ASSERT_EQ(shm.size(), gloo.size());
    for (size_t i = 0; i < shm.size(); ++i) EXPECT_TRUE(shm[i].equal(gloo[i])) << "parameter " << i << " view " << view;
  }
}

// Nothing is left to overlap with the last bucket: its comm hook reduces it on the backward
// thread. The earlier buckets still go to the communication thread (the trace's first bucket
// launched before backward ended: DDP.TraceShowsEarlyBucketsLaunchedBeforeBackwardEnds).
TEST(DDPSharedMemory, TheLastBucketIsReducedInItsCommHook) {
  run_ranks(2, [](ProcessGroup& g) {
    lockstep::testing::ParityMlp model;
    DistributedDataParallel ddp(model, g, DDPOptions().bucket_cap_mb(0.0005).first_bucket_mb(0.0002));
    ASSERT_EQ(ddp.reducer().transport().name(), "shared memory");
    for (int step = 1; step <= 3; ++step) {
      ddp.forward(torch::randn({4, 8})).sum().backward();
      const auto& trace = ddp.last_trace();
      ASSERT_GT(trace.buckets.size(), 1u);
      EXPECT_TRUE(trace.buckets.back().reduced_in_hook) << "step " << step;
      EXPECT_LE(trace.buckets.back().reduced.count(), trace.backward_end.count()) << "step " << step;
    }
  }, forever());
}

TEST(DDPSharedMemory, TheEnvironmentVariableTurnsItOff) {
  setenv("LOCKSTEP_DDP_SHARED_MEMORY", "0", 1);
  std::string transport;
  train_two_ranks(true, false, &transport);
  unsetenv("LOCKSTEP_DDP_SHARED_MEMORY");
  EXPECT_EQ(transport, "turned off by LOCKSTEP_DDP_SHARED_MEMORY=0 (ranks 0, 1)");
}

}  // namespace
}  // namespace shared_memory_allreduce_test
}  // namespace distributed
}  // namespace lockstep
