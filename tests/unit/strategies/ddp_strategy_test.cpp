// The DDP strategies as the connector makes them from --strategy and the Trainer flags, on 2
// ranks run as threads (tests/support/plan_ranks.h): what each registered name sets, the
// sampler split, and --sync-batchnorm; and on its own, in one process: the start methods it takes,
// the timeout its process group gets, and the default configure_ddp's device_ids (as PyTorch's
// DDP(device_ids=[i]): the module must be on that device).
#include <lockstep/strategies/ddp_strategy.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <lockstep/cli/trainer_flags.h>
#include <lockstep/core/error.h>
#include <lockstep/data/data_loader.h>
#include <lockstep/data/sampler.h>
#include <lockstep/distributed/collectives.h>
#include <lockstep/distributed/ddp/sync_batchnorm.h>
#include <lockstep/distributed/distributed_error.h>
#include <lockstep/plan/connector.h>
#include <lockstep/trainer/trainer_options.h>

#include "../../support/errors.h"
#include "../../support/plan_ranks.h"

namespace lockstep {
namespace ddp_strategy_test {
namespace {

using testing::run_plan_ranks;

PlanOptions two_cpu_ranks(const std::string& strategy) {
  return PlanOptions().accelerator("cpu").devices("2").strategy(strategy).timeout(20);
}

// A trunk that every forward uses and a head that this test's forwards skip.
struct BranchesImpl : torch::nn::Module {
  BranchesImpl() : trunk(register_module("trunk", torch::nn::Linear(4, 2))), head(register_module("head", torch::nn::Linear(2, 1))) {}
  torch::nn::Linear trunk, head;
};
TORCH_MODULE(Branches);

// One training step through `plan`'s strategy whose forward skips the head; rank r's input is r + 1.
void step_without_head(ExecutionPlan& plan, Branches& model) {
  auto& strategy = *plan.strategy;
  strategy.module_to_device(*model);
  auto wrapped = strategy.setup_module(model.ptr());
  wrapped->before_forward();
  auto out = model->trunk(torch::full({3, 4}, strategy.global_rank() + 1.0));
  wrapped->after_forward({out}, /*known=*/true);
  strategy.backward(out.sum());
}

TEST(DDPStrategyNames, FindUnusedParametersTrueTrainsAForwardThatSkipsABranch) {
  run_plan_ranks(2, two_cpu_ranks("ddp_find_unused_parameters_true"), [](ExecutionPlan& plan) {
    auto* ddp = dynamic_cast<strategies::DDPStrategy*>(plan.strategy.get());
    ASSERT_NE(ddp, nullptr) << plan.strategy->name();
    EXPECT_EQ(ddp->name(), "ddp_find_unused_parameters_true");
    EXPECT_TRUE(ddp->ddp_options().find_unused_parameters());
    Branches model;
    step_without_head(plan, model);
    // d(sum)/d(trunk.weight) is 3 rows of the input, (r + 1) * 3, averaged over ranks 0 and 1.
    EXPECT_TRUE(model->trunk->weight.grad().allclose(torch::full({2, 4}, 4.5)))
        << "rank " << plan.strategy->global_rank() << ": " << model->trunk->weight.grad();
  });
}

// `ddp` and `ddp_find_unused_parameters_false` leave find_unused_parameters false (PyTorch's and
// Lightning 2.x's default; the seed's DDPPlugin said true): a skipped branch is an error naming
// its parameters and the strategy that trains it.
TEST(DDPStrategyNames, DdpAndFindUnusedParametersFalseRefuseAForwardThatSkipsABranch) {
  for (const std::string name : {"ddp", "ddp_find_unused_parameters_false"}) {
    run_plan_ranks(2, two_cpu_ranks(name), [&](ExecutionPlan& plan) {
      auto* ddp = dynamic_cast<strategies::DDPStrategy*>(plan.strategy.get());
      ASSERT_NE(ddp, nullptr) << name;
      EXPECT_EQ(ddp->name(), name);
      EXPECT_FALSE(ddp->ddp_options().find_unused_parameters()) << name;
      Branches model;
      try {
        step_without_head(plan, model);
        ADD_FAILURE() << name << ": a forward that skips the head was accepted";
      } catch (const distributed::UnusedParametersError& e) {
        auto unused = e.parameter_names();
        std::sort(unused.begin(), unused.end());
        EXPECT_EQ(unused, (std::vector<std::string>{"head.bias", "head.weight"})) << name;
        EXPECT_NE(std::string(e.what()).find("--strategy ddp_find_unused_parameters_true"), std::string::npos)
            << name << ": " << e.what();
      }
    });
  }
}

// The split the Trainer and Fabric ask a DDP strategy for: this rank's share of a loader without
// a sampler; a loader with its own sampler is left alone.
TEST(DDPStrategySampler, ALoaderGetsThisRanksShareUnlessItHasASampler) {
  run_plan_ranks(2, two_cpu_ranks("ddp"), [](ExecutionPlan& plan) {
    const int rank = plan.strategy->global_rank();
    EXPECT_EQ(plan.strategy->distributed_sampler_kwargs(), std::make_optional(std::make_pair(2, rank)));
    auto numbered = std::make_shared<TensorDataset>(torch::arange(6, torch::kFloat32).unsqueeze(1), torch::zeros({6, 1}));
    DataLoader plain(numbered, DataLoaderOptions(6));
    strategies::add_distributed_sampler(*plan.strategy, plain, /*shuffle=*/false);
    EXPECT_TRUE(plain.batch(0).data.flatten().equal(torch::arange(rank, 6, 2, torch::kFloat32))) << "rank " << rank;
    DataLoader own(numbered, DataLoaderOptions(6));
    own.set_sampler(std::make_shared<distributed::DistributedSampler>(6, distributed::SamplerOptions(3, 2).shuffle(false)));
    strategies::add_distributed_sampler(*plan.strategy, own, /*shuffle=*/false);
    EXPECT_TRUE(own.batch(0).data.flatten().equal(torch::tensor({2.0f, 5.0f}))) << "rank " << rank << ": replaced";
  });
}

// --sync-batchnorm true with --strategy ddp: the BatchNorm is converted at setup, and after a
// training step on different data each rank holds the running statistics of the whole batch.
TEST(DDPStrategySyncBatchnorm, TheFlagConvertsBatchNormAndTheRanksAgreeOnTheWholeBatch) {
  TrainerOptions options;
  CLI::App app{"sync batchnorm", "prog"};
  cli::add_trainer_flags(app, options);
  const char* argv[] = {"prog", "--accelerator", "cpu", "--devices", "2", "--strategy", "ddp", "--sync-batchnorm", "true",
                        "--timeout", "20"};
  ASSERT_EQ(cli::parse_or_exit_code(app, 11, const_cast<char**>(argv)), -1);
  ASSERT_TRUE(options.sync_batchnorm());
  // Rank r's batch is rows 4r..4r+3 of `whole`; plain BatchNorm on all 8 rows is the reference.
  auto whole = torch::randn({8, 3}, at::make_generator<at::CPUGeneratorImpl>(5)) * 2 + 1;
  auto reference = torch::nn::BatchNorm1d(3);
  reference->forward(whole);
  run_plan_ranks(2, options, [&](ExecutionPlan& plan) {
    auto& strategy = *plan.strategy;
    torch::nn::Sequential model(torch::nn::BatchNorm1d(3));
    strategy.module_to_device(*model);
    auto wrapped = strategy.setup_module(model.ptr());
    auto sync = std::dynamic_pointer_cast<distributed::SyncBatchNormImpl>(model->ptr(0));
    ASSERT_TRUE(sync) << "rank " << strategy.global_rank() << ": the BatchNorm was not converted";
    wrapped->before_forward();
    auto out = model->forward(whole.narrow(0, 4 * strategy.global_rank(), 4));
    wrapped->after_forward({out}, /*known=*/true);
    strategy.backward((out * out).sum());
    EXPECT_TRUE(sync->running_mean.allclose(reference->running_mean, 1e-5, 1e-6))
        << "rank " << strategy.global_rank() << ": " << sync->running_mean << " vs " << reference->running_mean;
    EXPECT_TRUE(sync->running_var.allclose(reference->running_var, 1e-5, 1e-6))
        << "rank " << strategy.global_rank() << ": " << sync->running_var << " vs " << reference->running_var;
  });
}

TEST(DDPStrategyDevice, TheDefaultConfigureDdpRefusesAModuleOffItsDevice) {
  const auto module = std::make_shared<torch::nn::LinearImpl>(2, 1);  // on the CPU
  strategies::DDPStrategy strategy;
  const auto message = testing::error_of<UsageError>([&] { strategy.configure_ddp(module, {1}); });
  EXPECT_NE(message.find("DDPStrategy: parameter 'weight' is on cpu but this rank trains on cuda:1 (device_ids)"),
            std::string::npos) << message;
  EXPECT_NE(testing::error_of<UsageError>([&] { strategy.configure_ddp(module, {0, 1}); }).find("give one id"),
            std::string::npos);
  EXPECT_NO_THROW(strategies::DDPStrategy::check_on_device(*module, {})) << "on the CPU: no ids, module on the CPU";
}

// Lightning's start_method takes popen, spawn, fork and forkserver; spawn and forkserver are
// Python's multiprocessing. The message names the value and the two there are.
TEST(DDPStrategy, AStartMethodOtherThanPopenOrForkIsRefusedNamingBoth) {
  for (const std::string method : {"spawn", "forkserver", "Popen", ""}) {
    const auto message = testing::error_of([&] { strategies::DDPStrategy(distributed::DDPOptions(), method); });
    EXPECT_NE(message.find("ddp: start_method '" + method + "' is not one Lockstep has"), std::string::npos)
        << message;
    EXPECT_NE(message.find("use \"popen\" (re-executes the program for the other local ranks, the default) or "
                           "\"fork\"."),
              std::string::npos) << message;
  }
  EXPECT_EQ(strategies::DDPStrategy(distributed::DDPOptions(), "popen").name(), "ddp");
  EXPECT_EQ(strategies::DDPStrategy(distributed::DDPOptions(), "fork", "ddp_fork").name(), "ddp_fork");
}

// The timeout of the options (default 1800 s, as PyTorch's) is the process group's.
TEST(DDPStrategy, TheTimeoutOfTheOptionsReachesTheProcessGroup) {
  for (const double seconds : {1800.0, 42.0}) {
    auto options = PlanOptions().accelerator("cpu").devices("1").strategy("ddp");
    if (seconds != 1800.0) options.timeout(seconds);
    const auto plan = resolve_plan(options, environments::Environ(), nullptr, 0);
    plan.strategy->setup_environment();
    auto& ddp = dynamic_cast<strategies::DDPStrategy&>(*plan.strategy);
    EXPECT_EQ(ddp.process_group().timeout(), std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)));
  }
}

}  // namespace
}  // namespace ddp_strategy_test
}  // namespace lockstep
