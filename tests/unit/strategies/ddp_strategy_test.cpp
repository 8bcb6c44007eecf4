// DDPStrategy on its own: the start methods it takes, and the process group it makes from the
// connector's plan (one process, in this test's own process).
#include <lockstep/strategies/ddp_strategy.h>

#include <chrono>

#include <gtest/gtest.h>

#include <lockstep/core/error.h>
#include <lockstep/plan/connector.h>
#include "../../support/errors.h"

namespace lockstep {
namespace strategies {
namespace {

// Lightning's start_method takes popen, spawn, fork and forkserver; spawn and forkserver are
// Python's multiprocessing. The message names the value and the two there are.
TEST(DDPStrategy, AStartMethodOtherThanPopenOrForkIsRefusedNamingBoth) {
  for (const std::string method : {"spawn", "forkserver", "Popen", ""}) {
    const auto message = testing::error_of([&] { DDPStrategy(distributed::DDPOptions(), method); });
    EXPECT_NE(message.find("DDPStrategy start_method '" + method + "' is not one Lockstep has"), std::string::npos)
        << message;
    EXPECT_NE(message.find("use \"popen\" (re-executes the program for the other local ranks, the default) or "
                           "\"fork\"."),
              std::string::npos) << message;
  }
  EXPECT_EQ(DDPStrategy(distributed::DDPOptions(), "popen").name(), "ddp");
  EXPECT_EQ(DDPStrategy(distributed::DDPOptions(), "fork", "ddp_fork").name(), "ddp_fork");
}

// The timeout of the options (default 1800 s, as PyTorch's) is the process group's.
TEST(DDPStrategy, TheTimeoutOfTheOptionsReachesTheProcessGroup) {
  for (const double seconds : {1800.0, 42.0}) {
    auto options = PlanOptions().accelerator("cpu").devices("1").strategy("ddp");
    if (seconds != 1800.0) options.timeout(seconds);
    const auto plan = resolve_plan(options, environments::Environ(), nullptr, 0);
    plan.strategy->setup_environment();
    auto& ddp = dynamic_cast<DDPStrategy&>(*plan.strategy);
    EXPECT_EQ(ddp.process_group().timeout(), std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)));
  }
}

}  // namespace
}  // namespace strategies
}  // namespace lockstep
