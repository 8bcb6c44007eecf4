// --strategy ddp_separate as the connector makes it, on 2 ranks run as threads: buffers stay each
// rank's own (MMEditing's default), also when the strategy object is given options for another
// reason, and broadcast_buffers(true) brings rank 0's back.
#include <lockstep/strategies/separate_ddp_strategy.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../../support/plan_ranks.h"

namespace lockstep {
namespace separate_ddp_strategy_test {
namespace {

using distributed::DDPOptions;
using testing::run_plan_ranks;

struct NormsImpl : torch::nn::Module {
  NormsImpl() : norm(register_module("norm", torch::nn::BatchNorm1d(torch::nn::BatchNormOptions(3).momentum(0.5)))) {}
  torch::nn::BatchNorm1d norm;
};
TORCH_MODULE(Norms);

// The running variance after one training forward of a batch of variance 0, which halves it,
// from a start of rank + 2 on each rank.
double running_var_after_a_step(ExecutionPlan& plan) {
  auto& strategy = dynamic_cast<strategies::SeparateDDPStrategy&>(*plan.strategy);
  Norms model;
  strategy.setup_module(model.ptr());
  {
    torch::NoGradGuard no_grad;
    model->norm->running_var.fill_(strategy.global_rank() + 2.0);
  }
  strategy.separate_ddp()->module<torch::nn::BatchNorm1dImpl>("norm")(torch::ones({2, 3}));
  return model->norm->running_var[0].item<double>();
}

TEST(SeparateDDPStrategy, EachRankKeepsItsOwnBuffersUnlessTheOptionsSayBroadcast) {
  const auto options = PlanOptions().accelerator("cpu").devices("2").strategy("ddp_separate").timeout(20);
  struct Case {
    std::string what;
    std::function<std::shared_ptr<strategies::Strategy>()> make;  // null: the registered name
    bool broadcast;
  };
  const std::vector<Case> cases = {
      {"--strategy ddp_separate", nullptr, false},
      {"SeparateDDPStrategy(DDPOptions().bucket_cap_mb(50))",
       [] { return std::make_shared<strategies::SeparateDDPStrategy>(DDPOptions().bucket_cap_mb(50)); }, false},
      {"SeparateDDPStrategy(DDPOptions().broadcast_buffers(true))",
       [] { return std::make_shared<strategies::SeparateDDPStrategy>(DDPOptions().broadcast_buffers(true)); }, true},
  };
  for (const auto& c : cases) {
    run_plan_ranks(2, options, [&](ExecutionPlan& plan) {
      const int rank = plan.strategy->global_rank();
      const double expected = (c.broadcast ? 2.0 : rank + 2.0) / 2;
      EXPECT_DOUBLE_EQ(running_var_after_a_step(plan), expected) << c.what << ", rank " << rank;
    }, c.make);
  }
}

}  // namespace
}  // namespace separate_ddp_strategy_test
}  // namespace lockstep
