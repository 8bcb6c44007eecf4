// The --fsdp-* flags and their LOCKSTEP_TRAINER_* variables: each one given is set on the
// FSDPStrategy the connector chooses (on top of what its registered name or the object has), and
// with another strategy each one given is refused, a value equal to the default included.
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <lockstep/cli/trainer_flags.h>
#include <lockstep/plan/connector.h>
#include <lockstep/strategies/fsdp_strategy.h>

#include "../../support/errors.h"

namespace lockstep {
namespace fsdp_flags_test {

// Trainer options as the flags `args` set them; the parse's exit code in `code` (-1: parsed).
TrainerOptions trainer_flags(std::vector<std::string> args, int* code = nullptr) {
  TrainerOptions options;
  options.accelerator("cpu");
  CLI::App app("prog");
  cli::add_trainer_flags(app, options);
  args.insert(args.begin(), "prog");
  std::vector<char*> argv;
  for (auto& arg : args) argv.push_back(arg.data());
  ::testing::internal::CaptureStderr();
  const int exit_code = cli::parse_or_exit_code(app, static_cast<int>(argv.size()), argv.data());
  ::testing::internal::GetCapturedStderr();
  if (code) *code = exit_code;
  return options;
}

ExecutionPlan plan_of(const PlanOptions& options, std::shared_ptr<strategies::Strategy> object = nullptr) {
  return resolve_plan(options, environments::Environ(), std::move(object), 0);
}

const strategies::FSDPStrategy& fsdp_of(const ExecutionPlan& plan) {
  return dynamic_cast<const strategies::FSDPStrategy&>(*plan.strategy);
}

}  // namespace fsdp_flags_test

namespace {

using distributed::ShardingOptions;
using distributed::ShardingStrategy;
using fsdp_flags_test::fsdp_of;
using fsdp_flags_test::plan_of;
using fsdp_flags_test::trainer_flags;
using strategies::FSDPStrategy;
using testing::error_of;

TEST(FsdpFlags, EveryFlagReachesTheChosenStrategy) {
  int code = 0;
  const auto options = trainer_flags({"--strategy", "fsdp", "--fsdp-sharding", "shard_grad_op",
                                      "--fsdp-auto-wrap-min-params", "200", "--fsdp-auto-wrap-types",
                                      "ReLU, torch::nn::Linear", "--fsdp-activation-checkpointing-types", "Linear",
                                      "--fsdp-param-dtype", "bf16", "--fsdp-reduce-dtype", "16",
                                      "--fsdp-state-dict-type", "sharded"},
                                     &code);
  ASSERT_EQ(code, -1);
  const auto plan = plan_of(options);
  const auto& o = fsdp_of(plan).sharding_options();
  EXPECT_EQ(o.sharding_strategy(), ShardingStrategy::shard_grad_op);
  EXPECT_EQ(o.auto_wrap_min_params(), 200);
  EXPECT_EQ(o.auto_wrap_module_types(), (std::vector<std::string>{"ReLU", "torch::nn::Linear"}));
  EXPECT_EQ(o.activation_checkpointing_module_types(), (std::vector<std::string>{"Linear"}));
  EXPECT_EQ(o.param_dtype(), std::optional<at::ScalarType>(at::kBFloat16));
  EXPECT_EQ(o.reduce_dtype(), std::optional<at::ScalarType>(at::kHalf));
  EXPECT_EQ(fsdp_of(plan).state_dict_type(), strategies::StateDictType::sharded);
}

// A registered name gives the sharding, the flags the rest; a flag not given leaves what the name
// or the object has.
TEST(FsdpFlags, TheFlagsGoOnTopOfTheNameOrTheObject) {
  const auto hybrid = plan_of(trainer_flags({"--strategy", "fsdp_hybrid_shard", "--fsdp-hybrid-shard-size", "2"}));
  EXPECT_EQ(hybrid.strategy->name(), "fsdp_hybrid_shard");
  EXPECT_EQ(fsdp_of(hybrid).sharding_options().sharding_strategy(), ShardingStrategy::hybrid_shard);
  EXPECT_EQ(fsdp_of(hybrid).sharding_options().hybrid_shard_size(), 2);

  auto options = trainer_flags({"--fsdp-sharding", "NO_SHARD"});
  const auto object = std::make_shared<FSDPStrategy>(ShardingOptions().auto_wrap_min_params(7));
  plan_of(options, object);
  EXPECT_EQ(object->sharding_options().sharding_strategy(), ShardingStrategy::no_shard);
  EXPECT_EQ(object->sharding_options().auto_wrap_min_params(), 7) << "not given: the object's";

  EXPECT_EQ(fsdp_of(plan_of(trainer_flags({"--strategy", "fsdp_no_shard", "--fsdp-sharding", "NO_SHARD"})))
                .sharding_options()
                .sharding_strategy(),
            ShardingStrategy::no_shard)
      << "the flag agrees with the name";
  const auto contradiction =
      error_of([&] { plan_of(trainer_flags({"--strategy", "fsdp_no_shard", "--fsdp-sharding", "FULL_SHARD"})); });
  EXPECT_NE(contradiction.find("--fsdp-sharding FULL_SHARD contradicts --strategy fsdp_no_shard, which shards NO_SHARD. "
                               "Use --strategy fsdp --fsdp-sharding FULL_SHARD, or drop the flag."),
            std::string::npos)
      << contradiction;

  const auto message = error_of([&] { plan_of(trainer_flags({"--strategy", "fsdp", "--fsdp-hybrid-shard-size", "2"})); });
  EXPECT_NE(message.find("--fsdp-hybrid-shard-size 2 is for HYBRID_SHARD (--strategy fsdp_hybrid_shard), but the "
                         "sharding of --strategy fsdp is FULL_SHARD. Add --fsdp-sharding HYBRID_SHARD, or drop it."),
            std::string::npos) << message;
}

// Set or not is whether the flag (or its variable) was given: the default value given with
// another strategy is refused as any other, naming every flag given.
TEST(FsdpFlags, AValueEqualToTheDefaultWithAnotherStrategyIsRefused) {
  auto message = error_of([] { plan_of(trainer_flags({"--strategy", "ddp", "--fsdp-sharding", "FULL_SHARD"})); });
  EXPECT_NE(message.find("--fsdp-sharding FULL_SHARD is for --strategy fsdp (or fsdp_shard_grad_op, "
                         "fsdp_shard_optimizer_state, fsdp_hybrid_shard, fsdp_no_shard), but the strategy is ddp. "
                         "Add --strategy fsdp, or drop it."),
            std::string::npos) << message;
  message = error_of([] {
    plan_of(trainer_flags({"--fsdp-auto-wrap-min-params", "0", "--fsdp-state-dict-type", "full"}));
  });
  EXPECT_NE(message.find("--fsdp-auto-wrap-min-params 0 and --fsdp-state-dict-type full are for --strategy fsdp"),
            std::string::npos) << message;
  EXPECT_NE(message.find("but the strategy is single_device. Add --strategy fsdp, or drop them."), std::string::npos)
      << message;
  ::setenv("LOCKSTEP_TRAINER_FSDP_REDUCE_DTYPE", "bf16", 1);
  message = error_of([] { plan_of(trainer_flags({"--strategy", "ddp"})); });
  ::unsetenv("LOCKSTEP_TRAINER_FSDP_REDUCE_DTYPE");
  EXPECT_NE(message.find("--fsdp-reduce-dtype bf16 is for --strategy fsdp"), std::string::npos) << message;
  EXPECT_NE(message.find("Add --strategy fsdp, or use --precision bf16-mixed."), std::string::npos) << message;
  EXPECT_EQ(plan_of(trainer_flags({"--strategy", "ddp"})).strategy->name(), "ddp") << "no flag given: nothing refused";
}

// A bad value stops the parse (exit code 2), before any strategy is made.
TEST(FsdpFlags, ABadValueExitsTwoWhileParsing) {
  for (const auto& args : std::vector<std::vector<std::string>>{{"--fsdp-sharding", "ZERO9"},
                                                                {"--fsdp-param-dtype", "int8"},
                                                                {"--fsdp-state-dict-type", "local"},
                                                                {"--fsdp-auto-wrap-min-params", "-1"}}) {
    int code = 0;
    trainer_flags(args, &code);
    EXPECT_EQ(code, 2) << args[0];
  }
}

// Fabric's save writes whole tensors: its flags have no --fsdp-state-dict-type, and keep a
// configure_strategy the program set before them.
TEST(FsdpFlags, FabricHasTheShardingFlagsButNoStateDictType) {
  FabricOptions options;
  int calls = 0;
  options.accelerator("cpu").configure_strategy([&](strategies::Strategy&) { ++calls; });
  int64_t seed = -1;
  CLI::App app("prog");
  cli::add_fabric_flags(app, options, seed);
  EXPECT_EQ(app.get_option_no_throw("--fsdp-state-dict-type"), nullptr);
  app.parse("--strategy fsdp --fsdp-sharding SHARD_GRAD_OP", false);
  const auto plan = plan_of(options);
  EXPECT_EQ(fsdp_of(plan).sharding_options().sharding_strategy(), ShardingStrategy::shard_grad_op);
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace lockstep
