// AgreedStop: ranks (threads over a HashStore) whose steps synchronise through an all_reduce stop
// after the same step when one of them asks, whenever it asks; a caught signal is a request, and
// a second one ends the process.
#include <lockstep/distributed/agreed_stop.h>

#include <csignal>
#include <memory>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <lockstep/distributed/collectives.h>

#include "../../support/thread_ranks.h"

namespace lockstep {
namespace distributed {
namespace {

class AgreedStops : public ::testing::TestWithParam<int> {};

TEST_P(AgreedStops, EveryRankStopsAfterTheSameStepWhoeverAsksWhenever) {
  const int n = GetParam();
  for (int asker = 0; asker < n; ++asker) {
    for (int64_t ask_at : {1, 7}) {
      std::vector<int64_t> stopped_after(n, -1);
      std::vector<StopRequest> requests(n);
      testing::run_ranks(n, [&](ProcessGroup& g) {
        AgreedStop stop(std::shared_ptr<ProcessGroup>(&g, [](ProcessGroup*) {}), {});
        for (int64_t step = 1; step <= 400; ++step) {
          all_reduce(g, torch::ones({1}));  // the step's synchronisation, as DDP's gradients
          if (g.rank() == asker && step == ask_at) stop.request("rank " + std::to_string(asker) + " asked");
          if (auto request = stop.at_step(step)) {
            stopped_after[g.rank()] = step;
            requests[g.rank()] = *request;
            return;
          }
        }
      });
      for (int r = 0; r < n; ++r) {
        EXPECT_EQ(stopped_after[r], stopped_after[0]) << "rank " << r << ", asked by " << asker << " at " << ask_at;
        EXPECT_EQ(requests[r].reason, "rank " + std::to_string(asker) + " asked");
        EXPECT_EQ(requests[r].rank, asker);
        EXPECT_EQ(requests[r].signal, 0);
      }
      // At least one step after the ask (the ranks post where they learnt of it), and promptly.
      EXPECT_GT(stopped_after[0], ask_at);
      EXPECT_LT(stopped_after[0], 400) << "the ranks never stopped";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, AgreedStops, ::testing::Values(2, 4),
                         [](const ::testing::TestParamInfo<int>& info) { return "ranks" + std::to_string(info.param); });

TEST(AgreedStop, OneProcessStopsAfterTheStepOfTheRequest) {
  AgreedStop stop(nullptr, {});
  EXPECT_FALSE(stop.at_step(1));
  stop.request("the loss is nan");
  const auto request = stop.at_step(2);
  ASSERT_TRUE(request);
  EXPECT_EQ(request->reason, "the loss is nan");
}

TEST(AgreedStop, ACaughtSignalIsARequestUntilTheStopEnds) {
  struct sigaction before {};
  ::sigaction(SIGUSR1, nullptr, &before);
  {
    AgreedStop stop(nullptr, {SIGUSR1});
    EXPECT_FALSE(stop.at_step(4));
    std::raise(SIGUSR1);
    const auto request = stop.at_step(5);
    ASSERT_TRUE(request);
    EXPECT_EQ(request->signal, SIGUSR1);
    EXPECT_EQ(request->reason, "SIGUSR1 reached the process after step 5");
  }
  struct sigaction after {};
  ::sigaction(SIGUSR1, nullptr, &after);
  EXPECT_EQ(after.sa_handler, before.sa_handler) << "the handler from before must come back";
}

TEST(AgreedStop, ASecondSignalEndsTheProcessAsTheSignalWould) {
  ::testing::FLAGS_gtest_death_test_style = "threadsafe";
  EXPECT_EXIT(
      {
        AgreedStop stop(nullptr, {SIGTERM});
        std::raise(SIGTERM);
        std::raise(SIGTERM);
        std::_Exit(0);
      },
      ::testing::KilledBySignal(SIGTERM), "");
}

// A job started in the background (`./train &` in a script) ignores SIGINT: it goes on ignoring it.
TEST(AgreedStop, ASignalTheProcessIgnoresStaysIgnored) {
  struct sigaction ignore {}, before {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  ::sigaction(SIGINT, &ignore, &before);
  {
    AgreedStop stop(nullptr, {SIGINT});
    std::raise(SIGINT);
    EXPECT_FALSE(stop.at_step(1));
    struct sigaction during {};
    ::sigaction(SIGINT, nullptr, &during);
    EXPECT_EQ(during.sa_handler, SIG_IGN);
  }
  struct sigaction after {};
  ::sigaction(SIGINT, nullptr, &after);
  EXPECT_EQ(after.sa_handler, SIG_IGN);
  ::sigaction(SIGINT, &before, nullptr);
}

}  // namespace
}  // namespace distributed
}  // namespace lockstep
