#include <lockstep/distributed/ddp/join.h>

#include <chrono>
#include <mutex>
#include <tuple>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <lockstep/distributed/collectives.h>
#include <lockstep/distributed/ddp/ddp.h>

#include "../../../support/parity.h"
#include "../../../support/thread_ranks.h"

namespace lockstep {
namespace distributed {
namespace join_test {
namespace {

using lockstep::testing::clone_all;
using lockstep::testing::copy_into;
using lockstep::testing::ParityData;
using lockstep::testing::ParityMlp;
using lockstep::testing::parameter_names;
using lockstep::testing::parameters_close;
using lockstep::testing::run_ranks;

constexpr double kTolerance = 1e-6;
constexpr int64_t kPerRank = 4;

// Batches per rank: 10 and 13 as in the issue; with 4 ranks also one that stops after the first
// step (it joins before the buckets are rebuilt, so its shadow must take part in the rebuild).
std::vector<int> batches_for(int world) {
  return world == 2 ? std::vector<int>{10, 13} : std::vector<int>{10, 13, 1, 12};
}

// One process reproducing the arithmetic: per step, the sum of the active ranks' gradients
// divided by the world size (default) or by the number of active ranks.
std::vector<at::Tensor> train_reference(const std::vector<at::Tensor>& init, const ParityData& data,
                                        const std::vector<int>& batches, bool divide_by_world) {
  ParityMlp model;
  copy_into(model->parameters(), init);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  const int world = static_cast<int>(batches.size());
  const int steps = *std::max_element(batches.begin(), batches.end());
  for (int s = 0; s < steps; ++s) {
    torch::Tensor loss = torch::zeros({});
    int active = 0;
    for (int r = 0; r < world; ++r) {
      if (s >= batches[r]) continue;
      ++active;
      loss = loss + torch::mse_loss(model(data.input(s, r, kPerRank)), data.target(s, r, kPerRank));
    }
    opt.zero_grad();
    (loss / (divide_by_world ? world : active)).backward();
    opt.step();
  }
  return clone_all(model->parameters());
}

using lockstep::testing::Worst;

// world size x divide_by_initial_world_size x one bucket per parameter x gradient_as_bucket_view
using JoinParam = std::tuple<int, bool, bool, bool>;
class DDPJoin : public ::testing::TestWithParam<JoinParam> {};

TEST_P(DDPJoin, UnevenBatchesFinishAndMatchTheReference) {
  torch::set_num_threads(1);
  const int world = std::get<0>(GetParam());
  const bool divide_by_world = std::get<1>(GetParam());
  const bool per_param = std::get<2>(GetParam());
  const bool view = std::get<3>(GetParam());
  const auto batches = batches_for(world);
  torch::manual_seed(11);
  const auto init = clone_all(ParityMlp()->parameters());
  const ParityData data(*std::max_element(batches.begin(), batches.end()), world * kPerRank);
  const auto expected = train_reference(init, data, batches, divide_by_world);
  Worst worst;
  const auto start = std::chrono::steady_clock::now();
  run_ranks(world, [&](ProcessGroup& g) {
    ParityMlp model;
    if (g.rank() == 0) copy_into(model->parameters(), init);
    auto options = DDPOptions().gradient_as_bucket_view(view);
    if (per_param) options.bucket_cap_mb(1e-7).first_bucket_mb(1e-7);
    DistributedDataParallel ddp(model, g, options);
    torch::optim::SGD opt(ddp.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    {
      auto join = ddp.join(JoinOptions().divide_by_initial_world_size(divide_by_world));
      for (int s = 0; s < batches[g.rank()]; ++s) {
        opt.zero_grad();
        torch::mse_loss(ddp.forward(data.input(s, g.rank(), kPerRank)), data.target(s, g.rank(), kPerRank)).backward();
        opt.step();
      }
    }
    double w = 0;
    EXPECT_TRUE(parameters_close(model->parameters(), expected, kTolerance, parameter_names(*model), &w))
        << "rank " << g.rank() << " (" << batches[g.rank()] << " batches)";
    worst.update(w);
    // After the join a normal, even step works again on every rank.
    opt.zero_grad();
    ddp.forward(torch::ones({2, 8})).sum().backward();
    opt.step();
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << "[ join ] world " << world << " batches";
  for (int b : batches) std::cout << ' ' << b;
  std::cout << (divide_by_world ? ", divide by world size" : ", divide by active ranks")
            << (per_param ? ", bucket per parameter" : ", one bucket") << (view ? ", view" : ", copy")
            << ": max |diff| " << worst.value << ", " << seconds << " s\n";
  EXPECT_LT(seconds, 15.0);
}

INSTANTIATE_TEST_SUITE_P(WorldDivisorBucketsView, DDPJoin,
                         ::testing::Combine(::testing::Values(2, 4), ::testing::Bool(), ::testing::Bool(),
                                            ::testing::Bool()));

// The divisor really differs: with 13 vs 10 batches, the last 3 steps of the two conventions
// give different models.
TEST(DDPJoin, DivisorConventionsDiffer) {
  torch::manual_seed(11);
  const auto init = clone_all(ParityMlp()->parameters());
  const ParityData data(13, 2 * kPerRank);
  const auto by_world = train_reference(init, data, {10, 13}, true);
  const auto by_active = train_reference(init, data, {10, 13}, false);
  double largest = 0;
  for (size_t k = 0; k < by_world.size(); ++k) {
    largest = std::max(largest, lockstep::testing::max_difference(by_world[k], by_active[k]).max_abs);
  }
  EXPECT_GT(largest, 1e-4);
}

// find_unused_parameters / static_graph: the joined rank must also answer the allreduce of the
// used-parameter map (every step, or only the first).
class DDPJoinUsage : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(DDPJoinUsage, UnevenBatchesWithTheUsedParameterMap) {
  torch::set_num_threads(1);
  const int world = std::get<0>(GetParam());
  const bool static_graph = std::get<1>(GetParam());
  const auto batches = batches_for(world);
  torch::manual_seed(12);
  const auto init = clone_all(ParityMlp()->parameters());
  const ParityData data(13, world * kPerRank);
  const auto expected = train_reference(init, data, batches, true);
  run_ranks(world, [&](ProcessGroup& g) {
    ParityMlp model;
    if (g.rank() == 0) copy_into(model->parameters(), init);
    auto options = DDPOptions().bucket_cap_mb(0.0005).first_bucket_mb(0.0002);
    if (static_graph) {
      options.static_graph(true);
    } else {
      options.find_unused_parameters(true);
    }
    DistributedDataParallel ddp(model, g, options);
    torch::optim::SGD opt(ddp.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    {
      auto join = ddp.join();
      for (int s = 0; s < batches[g.rank()]; ++s) {
        opt.zero_grad();
        torch::mse_loss(ddp.forward(data.input(s, g.rank(), kPerRank)), data.target(s, g.rank(), kPerRank)).backward();
        opt.step();
      }
    }
    EXPECT_TRUE(parameters_close(model->parameters(), expected, kTolerance, parameter_names(*model))) << "rank " << g.rank();
  });
}

INSTANTIATE_TEST_SUITE_P(WorldFindUnusedOrStatic, DDPJoinUsage,
                         ::testing::Combine(::testing::Values(2, 4), ::testing::Bool()));

// A rank without any batch joins at once and shadows every step, the bucket rebuild included.
// A joined rank's own gradients (views into its buckets with gradient_as_bucket_view) are left
// as they were while it shadows the others, through Gloo and through shared memory alike.
class DDPJoinShadow : public ::testing::TestWithParam<bool> {};

TEST_P(DDPJoinShadow, LeavesTheJoinedRanksGradientsAlone) {
  torch::set_num_threads(1);
  const bool shared_memory = GetParam();
  run_ranks(2, [&](ProcessGroup& g) {
    ParityMlp model;
    DistributedDataParallel ddp(model, g, DDPOptions().gradient_as_bucket_view(true).shared_memory(shared_memory));
    ASSERT_EQ(ddp.reducer().transport().name() == "shared memory", shared_memory);
    torch::optim::SGD opt(ddp.parameters(), 0.1);
    std::vector<at::Tensor> last_grads;
    {
      auto join = ddp.join();
      const int batches = g.rank() == 0 ? 1 : 3;
      for (int s = 0; s < batches; ++s) {
        opt.zero_grad();
        ddp.forward(torch::full({2, 8}, 0.5 * (g.rank() + 1) + s)).sum().backward();
        opt.step();
      }
      for (const auto& p : model->parameters()) last_grads.push_back(p.grad().clone());
    }
    if (g.rank() != 0) return;
    const auto params = model->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_TRUE(params[i].grad().equal(last_grads[i])) << "parameter " << i << ": the shadow steps changed it";
    }
  });
}

INSTANTIATE_TEST_SUITE_P(SharedMemory, DDPJoinShadow, ::testing::Bool());

TEST(DDPJoin, ARankWithoutBatches) {
  torch::set_num_threads(1);
  const std::vector<int> batches{0, 4};
  torch::manual_seed(14);
  const auto init = clone_all(ParityMlp()->parameters());
  const ParityData data(4, 2 * kPerRank);
  const auto expected = train_reference(init, data, batches, true);
  run_ranks(2, [&](ProcessGroup& g) {
    ParityMlp model;
    if (g.rank() == 0) copy_into(model->parameters(), init);
    DistributedDataParallel ddp(model, g, DDPOptions().bucket_cap_mb(0.0005).first_bucket_mb(0.0002));
    torch::optim::SGD opt(ddp.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    {
      auto join = ddp.join();
      for (int s = 0; s < batches[g.rank()]; ++s) {
        opt.zero_grad();
        torch::mse_loss(ddp.forward(data.input(s, g.rank(), kPerRank)), data.target(s, g.rank(), kPerRank)).backward();
        opt.step();
      }
    }
    EXPECT_TRUE(parameters_close(model->parameters(), expected, kTolerance, parameter_names(*model))) << "rank " << g.rank();
  });
}

// Two DDPs in one Join (PyTorch's Join([model_a, model_b])): the first's forward carries the
// join handshake, the second's has its own; both are shadowed in order.
TEST(DDPJoin, TwoJoinablesInOneJoin) {
  torch::set_num_threads(1);
  const std::vector<int> batches{10, 13};
  torch::manual_seed(13);
  const auto init_a = clone_all(ParityMlp()->parameters());
  const auto init_b = clone_all(ParityMlp(8)->parameters());
  const ParityData data(13, 2 * kPerRank);
  const auto expected_a = train_reference(init_a, data, batches, true);
  run_ranks(2, [&](ProcessGroup& g) {
    ParityMlp a, b(8);
    if (g.rank() == 0) {
      copy_into(a->parameters(), init_a);
      copy_into(b->parameters(), init_b);
    }
    DistributedDataParallel ddp_a(a, g), ddp_b(b, g, DDPOptions().bucket_cap_mb(1e-7).first_bucket_mb(1e-7));
    torch::optim::SGD opt_a(ddp_a.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    torch::optim::SGD opt_b(ddp_b.parameters(), 0.05);
    {
      Join join({&ddp_a, &ddp_b});
      for (int s = 0; s < batches[g.rank()]; ++s) {
        const auto x = data.input(s, g.rank(), kPerRank);
        opt_a.zero_grad();
        torch::mse_loss(ddp_a.forward(x), data.target(s, g.rank(), kPerRank)).backward();
        opt_a.step();
        opt_b.zero_grad();
        ddp_b.forward(x).pow(2).mean().backward();
        opt_b.step();
      }
    }
    EXPECT_TRUE(parameters_close(a->parameters(), expected_a, kTolerance, parameter_names(*a))) << "rank " << g.rank();
    std::vector<at::Tensor> flat;
    for (const auto& p : b->parameters()) flat.push_back(p.detach().reshape({-1}));
    const auto gathered = all_gather(g, torch::cat(flat));
    EXPECT_TRUE(gathered[0].equal(gathered[1])) << "rank " << g.rank();
  });
}

// Buffers (BatchNorm statistics) come from the highest rank still training, and the final model
// (buffers included) from the last joiner.
TEST(DDPJoin, BuffersFollowTheLastActiveRank) {
  torch::set_num_threads(1);
  run_ranks(2, [&](ProcessGroup& g) {
    torch::manual_seed(3);
    auto model = torch::nn::Sequential(torch::nn::Linear(8, 6), torch::nn::BatchNorm1d(6), torch::nn::Linear(6, 2));
    DistributedDataParallel ddp(model.ptr(), g);
    torch::optim::SGD opt(ddp.parameters(), 0.05);
    const int mine = g.rank() == 0 ? 3 : 6;
    {
      auto join = ddp.join();
      for (int s = 0; s < mine; ++s) {
        opt.zero_grad();
        auto x = torch::full({4, 8}, static_cast<float>(s + 1 + 10 * g.rank())) + torch::arange(32).reshape({4, 8}) * 0.1;
        ddp.forward(x).pow(2).mean().backward();
        opt.step();
      }
    }
    // Gather both ranks' state: it must be identical after the join.
    std::vector<at::Tensor> state;
    for (const auto& p : model->parameters()) state.push_back(p.detach().reshape({-1}));
    for (const auto& b : model->buffers()) state.push_back(b.to(torch::kFloat).reshape({-1}));
    auto flat = torch::cat(state);
    auto gathered = all_gather(g, flat);
    EXPECT_TRUE(gathered[0].equal(gathered[1])) << "rank " << g.rank() << ": max diff "
                                                << (gathered[0] - gathered[1]).abs().max().item<double>();
    auto* bn = model[1]->as<torch::nn::BatchNorm1d>();
    EXPECT_EQ(bn->num_batches_tracked.item<int64_t>(), 6) << "rank " << g.rank();
  });
}

TEST(DDPJoin, ThrowOnEarlyTerminationStopsEveryRank) {
  torch::set_num_threads(1);
  std::mutex mutex;
  std::vector<std::string> errors(2);
  std::vector<int> steps_done(2, 0);
  run_ranks(2, [&](ProcessGroup& g) {
    ParityMlp model;
    DistributedDataParallel ddp(model, g);
    const int mine = g.rank() == 0 ? 3 : 5;
    try {
      auto join = ddp.join(JoinOptions().throw_on_early_termination(true));
      for (int s = 0; s < mine; ++s) {
        ddp.forward(torch::randn({2, 8})).sum().backward();
        steps_done[g.rank()] = s + 1;
      }
    } catch (const DistributedError& e) {
      std::lock_guard<std::mutex> lock(mutex);
      errors[g.rank()] = e.what();
    }
  });
  EXPECT_EQ(steps_done[0], 3);
  EXPECT_EQ(steps_done[1], 3);
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("rank(s) 0 ran out of inputs"), std::string::npos) << r << ": " << errors[r];
    EXPECT_NE(errors[r].find("throw_on_early_termination"), std::string::npos) << errors[r];
  }
}

TEST(DDPJoin, DisabledJoinMakesNoHandshake) {
  torch::set_num_threads(1);
  run_ranks(2, [&](ProcessGroup& g) {
    ParityMlp model;
    DistributedDataParallel ddp(model, g);
    {
      auto join = ddp.join(JoinOptions().enable(false));
      for (int s = 0; s < 3; ++s) ddp.forward(torch::randn({2, 8})).sum().backward();
    }
    EXPECT_EQ(ddp.last_trace().step, 3);
  });
}

TEST(DDPJoin, AnExceptionLeavingTheScopeSkipsTheShadowing) {
  torch::set_num_threads(1);
  run_ranks(2, [&](ProcessGroup& g) {
    ParityMlp model;
    DistributedDataParallel ddp(model, g);
    try {
      auto join = ddp.join();
      throw std::runtime_error("user error");
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "user error");
    }
    // The DDP is usable outside a join again: no handshake is expected.
    ddp.forward(torch::randn({2, 8})).sum().backward();
    EXPECT_EQ(ddp.last_trace().step, 1);
  });
}

}  // namespace
}  // namespace join_test
}  // namespace distributed
}  // namespace lockstep
