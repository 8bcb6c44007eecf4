// FSDPStrategy as the connector makes it from its registered names or takes it as an object with
// its ShardingOptions, on 2 ranks run as threads: the settings reach the wrapper, the optimizers it
// cannot step are refused, and the state it gives checkpoints is whole and loads back into the
// shards. (The --fsdp-* flags: tests/unit/cli/fsdp_flags_test.cpp.)
#include <lockstep/strategies/fsdp_strategy.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <lockstep/core/error.h>
#include <lockstep/checkpoint/checkpoint_io.h>
#include <lockstep/checkpoint/sharded_checkpoint.h>
#include <lockstep/plan/connector.h>
#include <lockstep/strategies/registry.h>

#include "../../support/plan_ranks.h"

namespace lockstep {
namespace fsdp_strategy_test {
namespace {

using distributed::ShardingOptions;
using distributed::ShardingStrategy;
using strategies::FSDPStrategy;
using strategies::StateDictType;
using testing::run_plan_ranks;

PlanOptions fsdp_ranks() { return PlanOptions().accelerator("cpu").devices("2").strategy("fsdp").timeout(20); }

torch::nn::Sequential model() {
  torch::manual_seed(5);
  return torch::nn::Sequential(torch::nn::Linear(6, 40), torch::nn::ReLU(), torch::nn::Linear(40, 3));
}

// Each sharding under a name of its own, as Lightning's fsdp_cpu_offload: the strategy reports the
// name and carries its sharding.
TEST(FSDPStrategyNames, EachShardingHasARegisteredName) {
  const std::vector<std::pair<std::string, ShardingStrategy>> names{
      {"fsdp", ShardingStrategy::full_shard},
      {"fsdp_shard_grad_op", ShardingStrategy::shard_grad_op},
      {"fsdp_shard_optimizer_state", ShardingStrategy::shard_optimizer_state},
      {"fsdp_hybrid_shard", ShardingStrategy::hybrid_shard},
      {"fsdp_no_shard", ShardingStrategy::no_shard}};
  for (const auto& [name, sharding] : names) {
    const auto strategy = strategies::create_strategy(name);
    const auto* fsdp = dynamic_cast<const FSDPStrategy*>(strategy.get());
    ASSERT_NE(fsdp, nullptr) << name;
    EXPECT_EQ(fsdp->name(), name);
    EXPECT_EQ(fsdp->sharding_options().sharding_strategy(), sharding) << name;
    EXPECT_EQ(fsdp->state_dict_type(), StateDictType::full) << name;
  }
}

// --strategy fsdp_hybrid_shard reaches the wrapper through the connector.
TEST(FSDPStrategyNames, ANamesShardingReachesTheWrapper) {
  std::vector<torch::nn::Sequential> models{model(), model()};
  run_plan_ranks(2, fsdp_ranks().strategy("fsdp_hybrid_shard"), [&](ExecutionPlan& plan) {
    auto& fsdp = dynamic_cast<FSDPStrategy&>(*plan.strategy);
    EXPECT_EQ(fsdp.name(), "fsdp_hybrid_shard");
    fsdp.setup_module(models[plan.strategy->global_rank()].ptr());
    EXPECT_EQ(fsdp.fsdp()->options().sharding_strategy(), ShardingStrategy::hybrid_shard);
  });
}

TEST(FSDPStrategySettings, TheShardingAndTheUnitsReachTheWrapper) {
  std::vector<torch::nn::Sequential> models{model(), model()};
  const auto make = [] {
    return std::make_shared<FSDPStrategy>(
        ShardingOptions().sharding_strategy(ShardingStrategy::shard_grad_op).auto_wrap_min_params(200));
  };
  run_plan_ranks(2, fsdp_ranks(), [&](ExecutionPlan& plan) {
    auto& fsdp = dynamic_cast<FSDPStrategy&>(*plan.strategy);
    fsdp.setup_module(models[plan.strategy->global_rank()].ptr());
    EXPECT_EQ(fsdp.fsdp()->options().sharding_strategy(), ShardingStrategy::shard_grad_op);
    EXPECT_EQ(fsdp.fsdp()->unit_count(), 2u) << "the 280-parameter Linear is a unit, the 123-parameter one is not";
  }, make);
}

// Units by type and activation checkpointing reach the wrapper's options and make units (what
// checkpointing does: FullyShardedDataParallel.Checkpoint* tests).
TEST(FSDPStrategySettings, UnitsByTypeAndCheckpointingReachTheWrapper) {
  std::vector<torch::nn::Sequential> models{model(), model()};
  const auto make = [] {
    return std::make_shared<FSDPStrategy>(ShardingOptions()
                                              .auto_wrap_module_types({"ReLU", "torch::nn::Linear"})
                                              .activation_checkpointing_module_types({"Linear"}));
  };
  run_plan_ranks(2, fsdp_ranks(), [&](ExecutionPlan& plan) {
    auto& fsdp = dynamic_cast<FSDPStrategy&>(*plan.strategy);
    fsdp.setup_module(models[plan.strategy->global_rank()].ptr());
    const auto& o = fsdp.fsdp()->options();
    EXPECT_EQ(o.auto_wrap_module_types(), (std::vector<std::string>{"ReLU", "torch::nn::Linear"}));
    EXPECT_EQ(o.activation_checkpointing_module_types(), (std::vector<std::string>{"Linear"}));
    EXPECT_EQ(fsdp.fsdp()->unit_count(), 4u) << "two Linear units, one ReLU unit and the root";
  }, make);
}

// param_dtype and reduce_dtype reach the wrapper, whose unit then computes in bfloat16 while the
// parameters it leaves between steps stay float32 (what the numbers are:
// FullyShardedDataParallel.MixedPrecisionComputesUnitsAndReducesInBfloat16).
TEST(FSDPStrategySettings, MixedPrecisionReachesTheWrapper) {
  std::vector<torch::nn::Sequential> models{model(), model()};
  const auto make = [] {
    return std::make_shared<FSDPStrategy>(
        ShardingOptions().auto_wrap_min_params(200).param_dtype(at::kBFloat16).reduce_dtype(at::kHalf));
  };
  run_plan_ranks(2, fsdp_ranks(), [&](ExecutionPlan& plan) {
    auto& fsdp = dynamic_cast<FSDPStrategy&>(*plan.strategy);
    auto& net = models[plan.strategy->global_rank()];
    auto wrapped = fsdp.setup_module(net.ptr());
    const auto& o = fsdp.fsdp()->options();
    EXPECT_EQ(o.param_dtype(), std::optional<at::ScalarType>(at::kBFloat16));
    EXPECT_EQ(o.reduce_dtype(), std::optional<at::ScalarType>(at::kHalf));
    wrapped->before_forward();
    const auto out = net->forward(torch::ones({2, 6}));
    EXPECT_EQ(out.scalar_type(), at::kFloat) << "the unit's output is cast back";
    out.sum().backward();
    for (const auto& p : net->parameters()) EXPECT_EQ(p.scalar_type(), at::kFloat);
  }, make);
}

// float16 compute needs CUDA: the strategy refuses it when the connector sets the CPU.
TEST(FSDPStrategySettings, Float16ComputeIsRefusedOnTheCpu) {
  const auto options = PlanOptions().accelerator("cpu").devices("1").strategy("fsdp");
  try {
    resolve_plan(options, environments::Environ(),
                 std::make_shared<FSDPStrategy>(ShardingOptions().param_dtype(at::kHalf)));
    ADD_FAILURE() << "float16 on the CPU was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("Use --fsdp-param-dtype bf16, or --accelerator cuda"), std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(resolve_plan(options, environments::Environ(),
                               std::make_shared<FSDPStrategy>(ShardingOptions().param_dtype(at::kBFloat16))));
}

TEST(FSDPStrategyOptimizers, LbfgsAndAnOptimizerWithStateAreRefused) {
  std::vector<torch::nn::Sequential> models{model(), model()};
  run_plan_ranks(2, fsdp_ranks(), [&](ExecutionPlan& plan) {
    auto& net = models[plan.strategy->global_rank()];
    torch::optim::Adam stepped(net->parameters(), 0.01);
    net->forward(torch::ones({2, 6})).sum().backward();
    stepped.step();
    plan.strategy->setup_module(net.ptr());
    torch::optim::LBFGS lbfgs(net->parameters());
    try {
      plan.strategy->check_optimizer(lbfgs);
      ADD_FAILURE() << "LBFGS was accepted";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("cannot step LBFGS"), std::string::npos) << e.what();
    }
    try {
      plan.strategy->check_optimizer(stepped);
      ADD_FAILURE() << "an optimizer with whole-parameter state was accepted";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("already has state"), std::string::npos) << e.what();
    }
    EXPECT_NO_THROW(plan.strategy->check_optimizer(torch::optim::Adam(net->parameters(), 0.01)));
  });
}

// The checkpoint state is whole on every rank, equal to the sharded training's parameters and
// Adam's moments; loading it back restores both after they changed.
TEST(FSDPStrategyState, WholeStateRoundTripsThroughTheShards) {
  std::vector<torch::nn::Sequential> models{model(), model()};
  run_plan_ranks(2, fsdp_ranks(), [&](ExecutionPlan& plan) {
    auto& strategy = *plan.strategy;
    auto& net = models[strategy.global_rank()];
    auto wrapped = strategy.setup_module(net.ptr());
    torch::optim::Adam opt(net->parameters(), 0.01);
    const auto step = [&] {
      wrapped->before_forward();
      net->forward(torch::full({4, 6}, strategy.global_rank() + 1.0)).pow(2).sum().backward();
      opt.step();
      opt.zero_grad();
    };
    step();
    const auto params = strategy.module_state_dict(*net);
    const auto moments = strategy.optimizer_state_dict(opt);
    EXPECT_EQ(params.at("0.weight").sizes(), (std::vector<int64_t>{40, 6}));
    const auto exp_avg = moments.at("state").toGenericDict().at(int64_t{0}).toGenericDict().at("exp_avg").toTensor();
    EXPECT_EQ(exp_avg.sizes(), (std::vector<int64_t>{40, 6}));
    step();
    c10::impl::GenericDict generic(c10::StringType::get(), c10::AnyType::get());
    for (const auto& item : params) generic.insert(item.key(), item.value().clone());
    strategy.load_module_state_dict(*net, generic);
    strategy.load_optimizer_state_dict(opt, moments);
    const auto back = strategy.module_state_dict(*net);
    for (const auto& item : params) EXPECT_TRUE(back.at(item.key()).equal(item.value())) << item.key();
    const auto moments_back = strategy.optimizer_state_dict(opt);
    EXPECT_TRUE(moments_back.at("state").toGenericDict().at(int64_t{0}).toGenericDict().at("exp_avg").toTensor().equal(
        exp_avg));
  });
}

// A sharded checkpoint that 2 ranks wrote loads on 4 ranks (each reads its pieces of the new
// layout, resharding): gathered there, the parameters and Adam's moments are the saved ones, bit
// for bit.
TEST(FSDPStrategyState, TwoRanksShardedCheckpointLoadsOnFourBitForBit) {
  testing::TempDir dir("lockstep_fsdp_reshard");
  const std::string path = dir / "two.ckpt";
  const auto sharded = [] {
    return std::make_shared<FSDPStrategy>(ShardingOptions().auto_wrap_min_params(200), StateDictType::sharded);
  };
  std::vector<torch::nn::Sequential> two{model(), model()};
  run_plan_ranks(2, fsdp_ranks(), [&](ExecutionPlan& plan) {
    auto& strategy = *plan.strategy;
    auto& net = two[strategy.global_rank()];
    auto wrapped = strategy.setup_module(net.ptr());
    auto opt = std::make_shared<torch::optim::Adam>(net->parameters(), 0.01);
    for (int step = 0; step < 2; ++step) {
      wrapped->before_forward();
      net->forward(torch::full({4, 6}, strategy.global_rank() + 1.0 + step)).pow(2).sum().backward();
      opt->step();
      opt->zero_grad();
    }
    auto state = checkpoint::make_checkpoint();
    state.insert("state_dict", strategy.module_state_dict(*net));
    c10::impl::GenericList optimizers(c10::AnyType::get());
    optimizers.push_back(strategy.optimizer_state_dict(*opt));
    state.insert("optimizer_states", optimizers);
    strategy.save_checkpoint(state, path, checkpoint::CheckpointIO(), {opt});
  }, sharded);
  ASSERT_TRUE(checkpoint::is_sharded_checkpoint(path));
  const auto saved = checkpoint::to_full_checkpoint(checkpoint::load_sharded(path));
  const auto saved_params = saved.at("state_dict").toGenericDict();
  const auto saved_moments = saved.at("optimizer_states").toList().get(0).toGenericDict().at("state").toGenericDict();

  std::vector<torch::nn::Sequential> four{model(), model(), model(), model()};
  run_plan_ranks(4, fsdp_ranks().devices("4"), [&](ExecutionPlan& plan) {
    auto& strategy = dynamic_cast<strategies::FSDPStrategy&>(*plan.strategy);
    auto& net = four[strategy.global_rank()];
    strategy.setup_module(net.ptr());
    auto opt = std::make_shared<torch::optim::Adam>(net->parameters(), 0.01);
    const auto loaded = strategy.load_checkpoint(path, checkpoint::CheckpointIO(), {opt});
    strategy.load_module_state_dict(*net, loaded.at("state_dict").toGenericDict(), /*strict=*/true);
    strategy.load_optimizer_state_dict(*opt, loaded.at("optimizer_states").toList().get(0).toGenericDict());
    auto& fsdp = *strategy.fsdp();
    for (const auto& [name, whole] : fsdp.full_state_dict()) {
      EXPECT_TRUE(whole.equal(saved_params.at(name).toTensor())) << name << ", rank " << strategy.global_rank();
    }
    const auto params = net->parameters();
    const auto mine = strategy.optimizer_state_dict(*opt).at("state").toGenericDict();  // this rank's pieces
    for (const char* moment : {"exp_avg", "exp_avg_sq"}) {
      std::vector<at::Tensor> pieces;
      for (size_t k = 0; k < params.size(); ++k) {
        pieces.push_back(mine.at(static_cast<int64_t>(k)).toGenericDict().at(moment).toTensor());
      }
      const auto whole = fsdp.gather_pieces(pieces);
      for (size_t k = 0; k < params.size(); ++k) {
        const auto expected = saved_moments.at(static_cast<int64_t>(k)).toGenericDict().at(moment).toTensor();
        EXPECT_TRUE(whole[k].equal(expected.view(whole[k].sizes()))) << moment << " of parameter " << k;
      }
    }
  }, sharded);
}

// embed -> head -> out, head's weight being embed's (a tied weight: one tensor registered twice,
// as "embed.weight" and "head_weight", in the root unit).
struct TiedImpl : torch::nn::Module {
  TiedImpl()
      : embed(register_module("embed", torch::nn::Linear(6, 6))),
        head_weight(register_parameter("head_weight", embed->weight)),
        out(register_module("out", torch::nn::Linear(6, 3))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return out(torch::relu(torch::nn::functional::linear(torch::relu(embed(x)), head_weight)));
  }
  torch::nn::Linear embed;
  torch::Tensor head_weight;
  torch::nn::Linear out;
};
TORCH_MODULE(Tied);

// The per-element state of one optimizer by parameter index and key ("0/exp_avg").
std::map<std::string, torch::Tensor> moments_of(const c10::impl::GenericDict& state) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& entry : state.at("state").toGenericDict()) {
    for (const auto& item : entry.value().toGenericDict()) {
      if (item.value().isTensor()) {
        out[std::to_string(entry.key().toInt()) + "/" + item.key().toStringRef()] = item.value().toTensor().clone();
      }
    }
  }
  return out;
}

// After a no-grad forward the root unit's parameters are still gathered (whole); saving then, full
// and sharded, with a tied weight, two optimizers each holding part of the module and parameters
// in no optimizer (out.bias), gives the state that was there before, and it loads back.
TEST(FSDPStrategyState, SavesAfterANoGradForwardWithATiedWeightAndTwoOptimizersLoadBack) {
  for (const std::string type : {"full", "sharded"}) {
    testing::TempDir dir("lockstep_fsdp_no_grad_save");
    const std::string path = dir / "tied.ckpt";
    std::vector<Tied> models{Tied(), Tied()};
    const auto make = [&type] {
      return std::make_shared<FSDPStrategy>(ShardingOptions(), strategies::parse_state_dict_type(type));
    };
    run_plan_ranks(2, fsdp_ranks(), [&](ExecutionPlan& plan) {
      auto& strategy = *plan.strategy;
      auto& net = models[strategy.global_rank()];
      auto wrapped = strategy.setup_module(net.ptr());
      auto opt_a = std::make_shared<torch::optim::Adam>(net->embed->parameters(), 0.01);
      auto opt_b = std::make_shared<torch::optim::Adam>(std::vector<torch::Tensor>{net->out->weight}, 0.01);
      const auto step = [&](double scale) {
        wrapped->before_forward();
        net->forward(torch::full({4, 6}, strategy.global_rank() + scale)).pow(2).sum().backward();
        opt_a->step();
        opt_b->step();
        opt_a->zero_grad();
        opt_b->zero_grad();
      };
      step(1.0);
      step(2.0);
      const auto state_now = [&] {
        std::vector<std::map<std::string, torch::Tensor>> out;
        for (const auto& opt : {opt_a, opt_b}) out.push_back(moments_of(strategy.optimizer_state_dict(*opt)));
        return out;
      };
      const auto params_before = strategy.module_state_dict(*net);
      const auto moments_before = state_now();
      {
        torch::NoGradGuard no_grad;
        wrapped->before_forward();
        net->forward(torch::ones({2, 6}));
      }
      const auto params = strategy.module_state_dict(*net);
      const auto moments = state_now();
      for (const auto& item : params_before) EXPECT_TRUE(params.at(item.key()).equal(item.value())) << type << " " << item.key();
      for (size_t o = 0; o < 2; ++o) {
        ASSERT_FALSE(moments[o].empty()) << type << ", optimizer " << o;
        for (const auto& [key, value] : moments_before[o]) {
          EXPECT_TRUE(moments[o].at(key).equal(value)) << type << ", optimizer " << o << ", " << key;
        }
      }
      auto state = checkpoint::make_checkpoint();
      state.insert("state_dict", params);
      c10::impl::GenericList optimizers(c10::AnyType::get());
      for (const auto& opt : {opt_a, opt_b}) optimizers.push_back(strategy.optimizer_state_dict(*opt));
      state.insert("optimizer_states", optimizers);
      strategy.save_checkpoint(state, path, checkpoint::CheckpointIO(), {opt_a, opt_b});
      strategy.barrier("saved");
      step(3.0);
      const auto loaded = strategy.load_checkpoint(path, checkpoint::CheckpointIO(), {opt_a, opt_b});
      strategy.load_module_state_dict(*net, loaded.at("state_dict").toGenericDict());
      const auto saved_optimizers = loaded.at("optimizer_states").toList();
      strategy.load_optimizer_state_dict(*opt_a, saved_optimizers.get(0).toGenericDict());
      strategy.load_optimizer_state_dict(*opt_b, saved_optimizers.get(1).toGenericDict());
      const auto back = strategy.module_state_dict(*net);
      for (const auto& item : params) EXPECT_TRUE(back.at(item.key()).equal(item.value())) << type << " " << item.key();
      const auto moments_back = state_now();
      for (size_t o = 0; o < 2; ++o) {
        ASSERT_EQ(moments_back[o].size(), moments[o].size()) << type;
        for (const auto& [key, value] : moments[o]) {
          EXPECT_TRUE(moments_back[o].at(key).equal(value)) << type << ", optimizer " << o << ", " << key;
        }
      }
    }, make);
  }
}

}  // namespace
}  // namespace fsdp_strategy_test
}  // namespace lockstep
