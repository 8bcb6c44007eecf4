#include <lockstep/distributed/ddp/ddp.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <sstream>
#include <tuple>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <lockstep/distributed/collectives.h>
#include <lockstep/distributed/module_state.h>

#include "../../../support/parity.h"
#include "../../../support/thread_ranks.h"

namespace lockstep {
namespace distributed {
namespace ddp_test {
namespace {

using lockstep::testing::clone_all;
using lockstep::testing::copy_into;
using lockstep::testing::OptimizerKind;
using lockstep::testing::ParityData;
using lockstep::testing::ParityMlp;
using lockstep::testing::parameter_names;
using lockstep::testing::parameters_close;
using lockstep::testing::run_ranks;

constexpr double kTolerance = 1e-6;
constexpr int kSteps = 5;
constexpr int64_t kPerRank = 4;

using lockstep::testing::Worst;

std::vector<at::Tensor> initial_parameters() {
  torch::manual_seed(1);
  ParityMlp model;
  return clone_all(model->parameters());
}

// One process on the whole batch: what every rank's parameters must equal.
std::vector<at::Tensor> train_reference(const std::vector<at::Tensor>& init, const ParityData& data, OptimizerKind kind) {
  ParityMlp model;
  copy_into(model->parameters(), init);
  auto opt = lockstep::testing::make_optimizer(kind, model->parameters());
  for (int s = 0; s < kSteps; ++s) {
    opt->zero_grad();
    auto loss = torch::mse_loss(model(data.inputs[s]), data.targets[s]);
    loss.backward();
    opt->step();
  }
  return clone_all(model->parameters());
}

// A rank's model: rank 0 starts from `init`, the others from their own random values, which
// DDP's broadcast must overwrite.
ParityMlp rank_model(const ProcessGroup& g, const std::vector<at::Tensor>& init) {
  ParityMlp model;
  if (g.rank() == 0) copy_into(model->parameters(), init);
  return model;
}

void single_threaded() { torch::set_num_threads(1); }

// Runs `body` on `world` thread ranks, each expected to throw an `Expected`; returns the messages,
// one per rank that threw it (a rank whose body returned is a test failure; another exception
// fails the test). Hooks' errors reach backward's caller as c10::Error, hence std::exception.
template <typename Expected = std::exception>
std::vector<std::string> errors_on_every_rank(int world, const std::function<void(ProcessGroup&)>& body) {
  std::mutex mutex;
  std::vector<std::string> errors;
  run_ranks(world, [&](ProcessGroup& g) {
    try {
      body(g);
      ADD_FAILURE() << "rank " << g.rank() << ": no error";
    } catch (const Expected& e) {
      std::lock_guard<std::mutex> lock(mutex);
      errors.push_back(message_of(e));
    }
  }, std::chrono::seconds(20));
  return errors;
}

// ---- Parity: world size x gradient_as_bucket_view x bucket size x optimizer ------------------

using ParityParam = std::tuple<int, bool, double, OptimizerKind>;
class DDPParity : public ::testing::TestWithParam<ParityParam> {};

TEST_P(DDPParity, MatchesOneProcessOnTheWholeBatch) {
  single_threaded();
  const int world = std::get<0>(GetParam());
  const bool view = std::get<1>(GetParam());
  const double cap = std::get<2>(GetParam());
  const OptimizerKind kind = std::get<3>(GetParam());
  const auto init = initial_parameters();
  const ParityData data(kSteps, world * kPerRank);
  const auto expected = train_reference(init, data, kind);
  Worst worst;
  size_t buckets_seen = 0;
  run_ranks(world, [&](ProcessGroup& g) {
    auto model = rank_model(g, init);
    auto options = DDPOptions().gradient_as_bucket_view(view).bucket_cap_mb(cap).first_bucket_mb(std::min(cap, 1.0) * 0.4);
    DistributedDataParallel ddp(model, g, options);
    auto opt = lockstep::testing::make_optimizer(kind, ddp.parameters());
    for (int s = 0; s < kSteps; ++s) {
      opt->zero_grad();
      auto loss = torch::mse_loss(ddp.forward(data.input(s, g.rank(), kPerRank)), data.target(s, g.rank(), kPerRank));
      loss.backward();
      opt->step();
    }
    double w = 0;
    EXPECT_TRUE(parameters_close(model->parameters(), expected, kTolerance, parameter_names(*model), &w))
        << "rank " << g.rank();
    worst.update(w);
    if (g.rank() == 0) buckets_seen = ddp.reducer().bucket_indices().size();
  });
  std::cout << "[ parity ] world " << world << (view ? " view" : " copy") << " cap " << cap << " MB, "
            << buckets_seen << " bucket(s), " << (kind == OptimizerKind::sgd ? "SGD" : "Adam")
            << ": max |diff| " << worst.value << "\n";
}

std::string parity_name(const ::testing::TestParamInfo<ParityParam>& info) {
  const double cap = std::get<2>(info.param);
  const std::string size = cap >= 1 ? "default" : cap >= 1e-4 ? "medium" : "per_param";
  return "world" + std::to_string(std::get<0>(info.param)) + (std::get<1>(info.param) ? "_view_" : "_copy_") + size +
         (std::get<3>(info.param) == OptimizerKind::sgd ? "_sgd" : "_adam");
}

// Caps: the default (one bucket for this small model), ~3 buckets, and one bucket per parameter.
INSTANTIATE_TEST_SUITE_P(WorldViewCapOptimizer, DDPParity,
                         ::testing::Combine(::testing::Values(2, 4), ::testing::Bool(),
                                            ::testing::Values(25.0, 0.0005, 1e-7),
                                            ::testing::Values(OptimizerKind::sgd, OptimizerKind::adam)),
                         parity_name);

// ---- no_sync: two accumulated micro-steps equal one step on the big batch ---------------------

class DDPNoSync : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(DDPNoSync, AccumulatedMicroStepsMatchTheWholeBatch) {
  single_threaded();
  const int world = std::get<0>(GetParam());
  const bool view = std::get<1>(GetParam());
  const auto init = initial_parameters();
  // Each rank sees 2 * kPerRank rows per step, as two micro-batches.
  const ParityData data(kSteps, world * 2 * kPerRank);
  const auto expected = train_reference(init, data, OptimizerKind::sgd);
  Worst worst;
  run_ranks(world, [&](ProcessGroup& g) {
    auto model = rank_model(g, init);
    DistributedDataParallel ddp(model, g, DDPOptions().gradient_as_bucket_view(view).bucket_cap_mb(1e-7).first_bucket_mb(1e-7));
    auto opt = lockstep::testing::make_optimizer(OptimizerKind::sgd, ddp.parameters());
    for (int s = 0; s < kSteps; ++s) {
      opt->zero_grad();
      auto x = data.input(s, g.rank(), 2 * kPerRank);
      auto y = data.target(s, g.rank(), 2 * kPerRank);
      {
        auto guard = ddp.no_sync();
        EXPECT_FALSE(ddp.require_backward_grad_sync());
        (torch::mse_loss(ddp.forward(x.narrow(0, 0, kPerRank)), y.narrow(0, 0, kPerRank)) / 2).backward();
      }
      EXPECT_TRUE(ddp.require_backward_grad_sync());
      (torch::mse_loss(ddp.forward(x.narrow(0, kPerRank, kPerRank)), y.narrow(0, kPerRank, kPerRank)) / 2).backward();
      opt->step();
    }
    double w = 0;
    EXPECT_TRUE(parameters_close(model->parameters(), expected, kTolerance, parameter_names(*model), &w))
        << "rank " << g.rank();
    worst.update(w);
  });
  std::cout << "[ no_sync ] world " << world << (view ? " view" : " copy") << ": max |diff| " << worst.value << "\n";
}

INSTANTIATE_TEST_SUITE_P(WorldView, DDPNoSync, ::testing::Combine(::testing::Values(2, 4), ::testing::Bool()));

// ---- Construction --------------------------------------------------------------------------

TEST(DDP, ParameterMismatchNamesTheParameterAndTheRanks) {
  single_threaded();
  const auto messages = errors_on_every_rank<DistributedError>(2, [](ProcessGroup& g) {
    ParityMlp model(g.rank() == 1 ? 32 : 16);
    DistributedDataParallel ddp(model, g);
  });
  ASSERT_EQ(messages.size(), 2u);
  for (const auto& m : messages) {
    EXPECT_NE(m.find("fc1.weight"), std::string::npos) << m;
    EXPECT_NE(m.find("rank 0 has 'fc1.weight Float [16, 8]'"), std::string::npos) << m;
    EXPECT_NE(m.find("rank 1 has 'fc1.weight Float [32, 8]'"), std::string::npos) << m;
  }
}

TEST(DDP, BroadcastsRankZerosParametersAndBuffersAtConstruction) {
  single_threaded();
  run_ranks(3, [](ProcessGroup& g) {
    auto model = torch::nn::BatchNorm1d(4);
    {
      torch::NoGradGuard no_grad;
      model->weight.fill_(g.rank() + 1.0);
      model->running_mean.fill_(g.rank() + 5.0);
    }
    auto ddp = make_ddp(model, g);
    EXPECT_TRUE(model->weight.eq(1.0).all().item<bool>()) << "rank " << g.rank() << ": " << model->weight;
    EXPECT_TRUE(model->running_mean.eq(5.0).all().item<bool>()) << "rank " << g.rank() << ": " << model->running_mean;
  });
}

// broadcast_tensors packs about 16 MiB per broadcast: tensors of every kind around that size
// (small ones packed together, 12 and 20 MiB ones that close buckets, a non-contiguous 24 MiB
// one, another dtype) all arrive whole, in place, from the source rank.
TEST(DDP, BroadcastTensorsArriveWholeAcrossItsBuckets) {
  run_ranks(2, [](ProcessGroup& g) {
    const auto values = [](int rank, int64_t n, at::ScalarType dtype) {
      return torch::arange(n, torch::TensorOptions().dtype(dtype)) + 1000.0 * (rank + 1);
    };
    std::vector<at::Tensor> tensors{values(g.rank(), 3, at::kFloat), values(g.rank(), 3 << 20, at::kFloat),
                                    values(g.rank(), 3 << 20, at::kFloat), values(g.rank(), 5 << 20, at::kFloat),
                                    values(g.rank(), 6 << 20, at::kFloat).view({3 << 10, 2 << 10}).t(),
                                    values(g.rank(), 7, at::kDouble), values(g.rank(), 5, at::kFloat)};
    std::vector<at::Tensor> expected;
    for (const auto& t : tensors) expected.push_back(values(1, t.numel(), t.scalar_type()).view(t.sizes()));
    expected[4] = values(1, 6 << 20, at::kFloat).view({3 << 10, 2 << 10}).t();
    broadcast_tensors(g, tensors, "test tensors", /*src=*/1);
    for (size_t i = 0; i < tensors.size(); ++i) {
      EXPECT_TRUE(tensors[i].equal(expected[i])) << "tensor " << i << ", rank " << g.rank();
    }
  });
}

class DDPBuffers : public ::testing::TestWithParam<bool> {};

TEST_P(DDPBuffers, BroadcastBuffersBeforeEachTrainingForwardOnly) {
  single_threaded();
  const bool broadcast = GetParam();
  run_ranks(2, [broadcast](ProcessGroup& g) {
    auto model = torch::nn::BatchNorm1d(torch::nn::BatchNormOptions(3).momentum(0.5));
    DistributedDataParallel ddp(model, g, DDPOptions().broadcast_buffers(broadcast));
    auto set_running_var = [&](double v) {
      torch::NoGradGuard no_grad;
      model->running_var.fill_(v);
    };
    // A training forward: rank 0's statistics, then this batch's (variance 0) mixed in by half.
    set_running_var(g.rank() + 2.0);
    ddp.forward(torch::ones({2, 3}));
    const double trained = broadcast ? 1.0 : (g.rank() + 2.0) / 2;
    EXPECT_TRUE(model->running_var.allclose(torch::full({3}, trained))) << "rank " << g.rank() << ": " << model->running_var;
    // Evaluation forwards (eval mode, or under NoGradGuard) keep each rank's own, as in PyTorch.
    model->eval();
    set_running_var(g.rank() + 2.0);
    ddp.forward(torch::ones({2, 3}));
    EXPECT_TRUE(model->running_var.eq(g.rank() + 2.0).all().item<bool>()) << "rank " << g.rank() << ": " << model->running_var;
    model->train();
    {
      torch::NoGradGuard no_grad;
      ddp.forward(torch::ones({2, 3}));
    }
    EXPECT_TRUE(model->running_var.allclose(torch::full({3}, (g.rank() + 2.0) / 2)))
        << "rank " << g.rank() << ": " << model->running_var;
  });
}

INSTANTIATE_TEST_SUITE_P(OnOff, DDPBuffers, ::testing::Bool());

// ---- gradient_as_bucket_view --------------------------------------------------------------

// Three steps of SGD through `options`; whether every parameter's grad aliases a bucket, per step.
std::vector<bool> grads_in_buckets(const DDPOptions& options) {
  std::vector<bool> per_step(3, true);
  run_ranks(2, [&](ProcessGroup& g) {
    ParityMlp model;
    DistributedDataParallel ddp(model, g, options);
    torch::optim::SGD opt(ddp.parameters(), 0.1);
    for (size_t step = 0; step < per_step.size(); ++step) {
      opt.zero_grad();
      ddp.forward(torch::randn({4, 8})).sum().backward();
      opt.step();
      const auto buffers = ddp.reducer().bucket_buffers();
      for (const auto& p : model->parameters()) {
        bool inside = false;
        for (const auto& b : buffers) inside = inside || (p.grad().defined() && p.grad().is_alias_of(b));
        if (!inside && g.rank() == 0) per_step[step] = false;
      }
    }
  });
  return per_step;
}

TEST(DDP, GradientsAreViewsIntoTheBucketsAndSurviveZeroGrad) {
  single_threaded();
  EXPECT_EQ(grads_in_buckets(DDPOptions().gradient_as_bucket_view(true).bucket_cap_mb(0.0005).first_bucket_mb(0.0002)),
            std::vector<bool>(3, true));
}

// Lockstep's default (PyTorch's is false): the same values with one copy less per step.
TEST(DDP, GradientsAreBucketViewsByDefaultAndCopiesWhenAsked) {
  single_threaded();
  EXPECT_EQ(grads_in_buckets(DDPOptions()), std::vector<bool>(3, true));
  EXPECT_EQ(grads_in_buckets(DDPOptions().gradient_as_bucket_view(false)), std::vector<bool>(3, false));
}

// ---- find_unused_parameters ---------------------------------------------------------------

// fc3 is a second head that forward uses only when `use_head` says so for this rank.
struct BranchyImpl : torch::nn::Module {
  BranchyImpl()
      : fc1(register_module("fc1", torch::nn::Linear(8, 16))),
        fc2(register_module("fc2", torch::nn::Linear(16, 4))),
        fc3(register_module("fc3", torch::nn::Linear(16, 4))) {}
  torch::Tensor forward(const torch::Tensor& x, bool use_head) {
    auto h = torch::relu(fc1(x));
    auto out = fc2(h);
    return use_head ? out + fc3(h) : out;
  }
  torch::nn::Linear fc1, fc2, fc3;
};
TORCH_MODULE(Branchy);

// The reference for a step: mean over ranks of each rank's loss, with each rank's branch choice.
std::vector<at::Tensor> train_branchy_reference(const std::vector<at::Tensor>& init, const ParityData& data, int world,
                                                const std::function<bool(int, int)>& use_head) {
  Branchy model;
  copy_into(model->parameters(), init);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int s = 0; s < kSteps; ++s) {
    opt.zero_grad();
    torch::Tensor loss = torch::zeros({});
    for (int r = 0; r < world; ++r) {
      loss = loss + torch::mse_loss(model(data.input(s, r, kPerRank), use_head(s, r)), data.target(s, r, kPerRank));
    }
    (loss / world).backward();
    opt.step();
  }
  return clone_all(model->parameters());
}

class DDPFindUnused : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(DDPFindUnused, TrainsWhenABranchIsSkipped) {
  single_threaded();
  const int world = std::get<0>(GetParam());
  const bool view = std::get<1>(GetParam());
  torch::manual_seed(3);
  const auto init = clone_all(Branchy()->parameters());
  const ParityData data(kSteps, world * kPerRank);
  // Every rank skips the head on even steps; on odd steps only rank 0 uses it.
  auto use_head = [](int step, int rank) { return step % 2 == 1 && rank == 0; };
  const auto expected = train_branchy_reference(init, data, world, use_head);
  Worst worst;
  run_ranks(world, [&](ProcessGroup& g) {
    Branchy model;
    if (g.rank() == 0) copy_into(model->parameters(), init);
    DistributedDataParallel ddp(model, g, DDPOptions().find_unused_parameters(true).gradient_as_bucket_view(view)
                                              .bucket_cap_mb(0.0005).first_bucket_mb(0.0002));
    torch::optim::SGD opt(ddp.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    for (int s = 0; s < kSteps; ++s) {
      opt.zero_grad();
      auto out = ddp.forward(data.input(s, g.rank(), kPerRank), use_head(s, g.rank()));
      const auto unused = ddp.reducer().unused_parameter_names();
      EXPECT_EQ(unused.size(), use_head(s, g.rank()) ? 0u : 2u) << "step " << s << " rank " << g.rank();
      torch::mse_loss(out, data.target(s, g.rank(), kPerRank)).backward();
      if (s == 0) {
        // No rank used the head: its gradient stays undefined, as in PyTorch.
        EXPECT_FALSE(model->fc3->weight.grad().defined()) << "rank " << g.rank();
      } else if (s == 1) {
        EXPECT_TRUE(model->fc3->weight.grad().defined()) << "rank " << g.rank();
      }
      opt.step();
    }
    double w = 0;
    EXPECT_TRUE(parameters_close(model->parameters(), expected, kTolerance, parameter_names(*model), &w))
        << "rank " << g.rank();
    worst.update(w);
  });
  std::cout << "[ find_unused ] world " << world << (view ? " view" : " copy") << ": max |diff| " << worst.value << "\n";
}

INSTANTIATE_TEST_SUITE_P(WorldView, DDPFindUnused, ::testing::Combine(::testing::Values(2, 4), ::testing::Bool()));

TEST(DDP, StaticGraphTrainsAModelThatAlwaysSkipsABranch) {
  single_threaded();
  torch::manual_seed(5);
  const auto init = clone_all(Branchy()->parameters());
  const int world = 2;
  const ParityData data(kSteps, world * kPerRank);
  auto never = [](int, int) { return false; };
  const auto expected = train_branchy_reference(init, data, world, never);
  Worst worst;
  run_ranks(world, [&](ProcessGroup& g) {
    Branchy model;
    if (g.rank() == 0) copy_into(model->parameters(), init);
    DistributedDataParallel ddp(model, g, DDPOptions().static_graph(true).bucket_cap_mb(1e-7).first_bucket_mb(1e-7));
    torch::optim::SGD opt(ddp.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    for (int s = 0; s < kSteps; ++s) {
      opt.zero_grad();
      torch::mse_loss(ddp.forward(data.input(s, g.rank(), kPerRank), false), data.target(s, g.rank(), kPerRank)).backward();
      opt.step();
      EXPECT_FALSE(model->fc3->weight.grad().defined()) << "step " << s;
    }
    // Rebuilt from the first step's order: the used parameters first, fc3's last.
    const auto buckets = ddp.reducer().bucket_indices();
    const auto& names = ddp.reducer().parameter_names();
    EXPECT_EQ(names[buckets.back()[0]].rfind("fc3.", 0), 0u) << names[buckets.back()[0]];
    double w = 0;
    EXPECT_TRUE(parameters_close(model->parameters(), expected, kTolerance, parameter_names(*model), &w))
        << "rank " << g.rank();
    worst.update(w);
  });
  std::cout << "[ static_graph ] world " << world << ": max |diff| " << worst.value << "\n";
}

// A branch used only in a no_sync micro-step (never in the synchronised one) still counts as
// used in that accumulation window, as in PyTorch: its gradient is averaged over the ranks in
// both gradient_as_bucket_view modes, never left local (which would move the replicas apart).
class DDPNoSyncOnlyBranch : public ::testing::TestWithParam<bool> {};

TEST_P(DDPNoSyncOnlyBranch, IsAveragedOnEveryRank) {
  single_threaded();
  const bool view = GetParam();
  const int world = 2;
  // A fixed start: the ranks' threads draw from one generator in no fixed order, and some starts
  // leave every ReLU of fc1 dead by the third step, where fc3's gradient is zero on both ranks.
  torch::manual_seed(7);
  const auto init = clone_all(Branchy()->parameters());
  std::vector<at::Tensor> accumulated(world), reduced(world);
  run_ranks(world, [&](ProcessGroup& g) {
    Branchy model;
    copy_into(model->parameters(), init);
    DistributedDataParallel ddp(model, g, DDPOptions().find_unused_parameters(true).gradient_as_bucket_view(view)
                                              .bucket_cap_mb(0.0005).first_bucket_mb(0.0002));
    torch::optim::SGD opt(ddp.parameters(), 0.1);
    for (int step = 0; step < 3; ++step) {  // three accumulation windows on the same buckets
      opt.zero_grad();
      // Rank-dependent inputs of both signs.
      const auto x = torch::linspace(-1.0, 1.0, 32).reshape({4, 8}) * (g.rank() + 1) + 0.01 * step;
      {
        auto guard = ddp.no_sync();
        ddp.forward(x, true).pow(2).sum().backward();
      }
      accumulated[g.rank()] = model->fc3->weight.grad().clone();
      ddp.forward(x, false).sum().backward();
      reduced[g.rank()] = model->fc3->weight.grad().clone();
      opt.step();
      // Both ranks have recorded this step before either compares.
      barrier(g, "recorded");
      const auto mean = (accumulated[0] + accumulated[1]) / 2;
      EXPECT_TRUE(reduced[g.rank()].equal(reduced[1 - g.rank()])) << "step " << step << " rank " << g.rank();
      EXPECT_TRUE(reduced[g.rank()].allclose(mean, 1e-6, 1e-7))
          << "step " << step << " rank " << g.rank() << ": max |diff| "
          << (reduced[g.rank()] - mean).abs().max().item<double>();
      EXPECT_FALSE(accumulated[0].equal(accumulated[1])) << "the ranks' own gradients must differ";
      barrier(g, "compared");
    }
  });
}

INSTANTIATE_TEST_SUITE_P(View, DDPNoSyncOnlyBranch, ::testing::Bool());

// backward(retain_graph), then backward again without a forward: the second pass's gradients
// would stay local. Every rank refuses it at once, naming the fix.
TEST(DDP, ASecondBackwardThroughOneForwardIsAnErrorOnEveryRank) {
  single_threaded();
  std::mutex mutex;
  std::vector<std::string> errors;
  std::chrono::steady_clock::duration slowest{};
  run_ranks(2, [&](ProcessGroup& g) {
    ParityMlp model;
    DistributedDataParallel ddp(model, g);
    auto loss = ddp.forward(torch::randn({4, 8})).sum();
    loss.backward({}, /*retain_graph=*/true);
    const auto start = std::chrono::steady_clock::now();
    try {
      loss.backward();
      ADD_FAILURE() << "rank " << g.rank() << ": the second backward was accepted";
    } catch (const c10::Error& e) {  // the autograd engine rethrows the hook's error as c10::Error
      std::lock_guard<std::mutex> lock(mutex);
      errors.push_back(e.what_without_backtrace());
      slowest = std::max(slowest, std::chrono::steady_clock::now() - start);
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mutex);
      errors.push_back(e.what());
      slowest = std::max(slowest, std::chrono::steady_clock::now() - start);
    }
  }, std::chrono::seconds(20));
  ASSERT_EQ(errors.size(), 2u);
  for (const auto& m : errors) {
    EXPECT_NE(m.find("a second backward through the same forward"), std::string::npos) << m;
    EXPECT_NE(m.find("no_sync()"), std::string::npos) << m;
    EXPECT_NE(m.find("static_graph(true)"), std::string::npos) << m;
  }
  // Local on every rank: no collective is waited for (the group timeout here is 20 s).
  std::cout << "[ second backward ] refused after "
            << std::chrono::duration<double>(slowest).count() << " s at most\n";
  EXPECT_LT(slowest, std::chrono::seconds(5));
}

// A backward under no_sync may follow another one (accumulation) without any error.
TEST(DDP, BackwardsUnderNoSyncMayRepeat) {
  single_threaded();
  run_ranks(2, [](ProcessGroup& g) {
    ParityMlp model;
    DistributedDataParallel ddp(model, g);
    ddp.forward(torch::randn({4, 8})).sum().backward();
    auto guard = ddp.no_sync();
    auto loss = ddp.forward(torch::randn({4, 8})).sum();
    loss.backward({}, /*retain_graph=*/true);
    EXPECT_NO_THROW(loss.backward());
  });
}

class DDPUnusedError : public ::testing::TestWithParam<double> {};

TEST_P(DDPUnusedError, WithoutFindUnusedASkippedBranchIsAClearError) {
  single_threaded();
  const double cap = GetParam();
  std::mutex mutex;
  std::vector<std::string> backward_errors, forward_errors;
  run_ranks(2, [&](ProcessGroup& g) {
    Branchy model;
    DistributedDataParallel ddp(model, g, DDPOptions().bucket_cap_mb(cap).first_bucket_mb(std::min(cap, 1.0)));
    auto x = torch::randn({4, 8});
    // One good step first: the error must also come after buckets were rebuilt.
    ddp.forward(x, true).sum().backward();
    try {
      ddp.forward(x, false).sum().backward();
      ADD_FAILURE() << "rank " << g.rank() << ": backward did not fail";
    } catch (const UnusedParametersError& e) {
      EXPECT_EQ(e.parameter_names(), (std::vector<std::string>{"fc3.weight", "fc3.bias"}));
      std::lock_guard<std::mutex> lock(mutex);
      backward_errors.push_back(e.what());
    }
    try {
      ddp.forward(x, true);
      ADD_FAILURE() << "rank " << g.rank() << ": the next forward did not fail";
    } catch (const DistributedError& e) {
      std::lock_guard<std::mutex> lock(mutex);
      forward_errors.push_back(e.what());
    }
  });
  ASSERT_EQ(backward_errors.size(), 2u);
  for (const auto& m : backward_errors) {
    EXPECT_NE(m.find("not used in producing loss: fc3.weight, fc3.bias"), std::string::npos) << m;
    EXPECT_NE(m.find("DDPOptions().find_unused_parameters(true)"), std::string::npos) << m;
  }
  ASSERT_EQ(forward_errors.size(), 2u);
  for (const auto& m : forward_errors) {
    EXPECT_NE(m.find("Expected to have finished reduction in the prior iteration"), std::string::npos) << m;
  }
}

// One bucket for all, and one bucket per parameter.
INSTANTIATE_TEST_SUITE_P(BucketCaps, DDPUnusedError, ::testing::Values(25.0, 1e-7));

TEST(DDP, ARankWithoutTheGradientFailsAndTheOthersDoNotHang) {
  single_threaded();
  std::mutex mutex;
  std::vector<std::string> errors(2);
  const auto start = std::chrono::steady_clock::now();
  run_ranks(
      2,
      [&](ProcessGroup& g) {
        Branchy model;
        DistributedDataParallel ddp(model, g, DDPOptions().bucket_cap_mb(1e-7).first_bucket_mb(1e-7));
        try {
          // Only rank 0 uses the head: rank 1 misses fc3's gradients, rank 0 waits for rank 1.
          ddp.forward(torch::randn({4, 8}), g.rank() == 0).sum().backward();
        } catch (const DistributedError& e) {
          std::lock_guard<std::mutex> lock(mutex);
          errors[g.rank()] = e.what();
        }
      },
      std::chrono::seconds(3));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(15));
  EXPECT_NE(errors[1].find("not used in producing loss: fc3.weight, fc3.bias"), std::string::npos) << errors[1];
  EXPECT_NE(errors[0].find("rank 0/2: allreduce of bucket"), std::string::npos) << errors[0];
  std::cout << "[ no hang ] rank 0: " << errors[0].substr(0, 300) << "\n";
}

// ---- Trace (overlap) and API shapes --------------------------------------------------------

TEST(DDP, TraceShowsEarlyBucketsLaunchedBeforeBackwardEnds) {
  single_threaded();
  run_ranks(2, [](ProcessGroup& g) {
    ParityMlp model;
    auto ddp = make_ddp(model, g, DDPOptions().bucket_cap_mb(1e-7).first_bucket_mb(1e-7));
    for (int step = 1; step <= 3; ++step) {
      ddp->forward(torch::randn({4, 8})).sum().backward();
      const auto& trace = ddp->last_trace();
      EXPECT_EQ(trace.step, step);
      ASSERT_EQ(trace.buckets.size(), 6u);
      for (const auto& b : trace.buckets) {
        EXPECT_LE(b.ready.count(), b.launched.count()) << "bucket " << b.index;
        EXPECT_LE(b.launched.count(), b.reduced.count()) << "bucket " << b.index;
        EXPECT_LE(b.reduced.count(), trace.finished.count()) << "bucket " << b.index;
      }
      // The first bucket (the last layer's) was sent while backward still ran.
      EXPECT_LT(trace.buckets.front().launched.count(), trace.backward_end.count());
    }
  });
}

TEST(DDP, NoCommunicationWithoutGradMode) {
  single_threaded();
  run_ranks(2, [](ProcessGroup& g) {
    ParityMlp model;
    DistributedDataParallel ddp(model, g);
    {
      torch::NoGradGuard no_grad;
      ddp.forward(torch::randn({2, 8}));
    }
    EXPECT_EQ(ddp.last_trace().step, 0);
    auto x = torch::full({2, 8}, static_cast<float>(g.rank() + 1));
    ddp(x).sum().backward();
    EXPECT_EQ(ddp.last_trace().step, 1);
  });
}

// A forward that calls the module itself (not the wrapper), then a plain backward: in PyTorch the
// gradients would stay local without a word. Here every rank refuses it, naming the wrapper; the
// same after a synchronised step, where it reads as a second backward with the same two causes.
TEST(DDP, ABackwardThroughTheModuleItselfIsRefusedNotLeftLocal) {
  single_threaded();
  for (bool after_a_step : {false, true}) {
    const auto errors = errors_on_every_rank(2, [&](ProcessGroup& g) {
      ParityMlp model;
      DistributedDataParallel ddp(model, g);
      const auto x = torch::full({2, 8}, static_cast<float>(g.rank() + 1));
      if (after_a_step) ddp(x).sum().backward();
      model->forward(x).sum().backward();  // bypasses the wrapper
    });
    ASSERT_EQ(errors.size(), 2u);
    for (const auto& m : errors) {
      EXPECT_NE(m.find("instead of its wrapper"), std::string::npos) << m;
      EXPECT_NE(m.find("net->forward(x)"), std::string::npos) << m;
      EXPECT_NE(m.find("drift apart"), std::string::npos) << m;
    }
  }
}

// Evaluating with BatchNorm on rank 0 alone, under NoGradGuard and after a first step (whose
// bucket rebuild is then pending), runs no collective: the other rank is meanwhile in a barrier,
// and both train on afterwards as one.
TEST(DDP, EvaluatingOnOneRankAloneUnderNoGradDoesNotBlock) {
  single_threaded();
  torch::manual_seed(2);
  run_ranks(2, [](ProcessGroup& g) {
    torch::nn::Sequential model(torch::nn::Linear(8, 6), torch::nn::BatchNorm1d(6), torch::nn::Linear(6, 1));
    DistributedDataParallel ddp(model.ptr(), g);
    torch::optim::SGD opt(ddp.parameters(), 0.1);
    auto step = [&] {
      opt.zero_grad();
      ddp.forward(torch::randn({4, 8}) * (g.rank() + 1)).pow(2).mean().backward();
      opt.step();
    };
    step();
    if (g.rank() == 0) {
      model->eval();
      torch::NoGradGuard no_grad;
      ddp.forward(torch::randn({3, 8}));
      model->train();
    }
    barrier(g, "evaluated");
    step();
    auto params = torch::cat({model->parameters()[0].flatten(), model->parameters().back().flatten()});
    auto other = params.clone();
    broadcast_tensor(g, other, 1);
    EXPECT_TRUE(params.equal(other)) << "rank " << g.rank();
  }, std::chrono::seconds(8));
}

// A manually optimised step calls the module's parts itself: after sync_every_backward(), every
// backward is averaged, here two half losses per step through a branch that some ranks skip
// (find_unused_parameters, found at the end of each backward): the same as one process.
TEST(DDP, SyncEveryBackwardAveragesEachBackwardAndFindsUnusedAtItsEnd) {
  single_threaded();
  const int world = 2;
  torch::manual_seed(3);
  const auto init = clone_all(Branchy()->parameters());
  const ParityData data(kSteps, world * kPerRank);
  auto use_head = [](int step, int rank) { return step % 2 == 1 && rank == 0; };
  const auto expected = train_branchy_reference(init, data, world, use_head);
  Worst worst;
  run_ranks(world, [&](ProcessGroup& g) {
    Branchy model;
    if (g.rank() == 0) copy_into(model->parameters(), init);
    DistributedDataParallel ddp(model, g, DDPOptions().find_unused_parameters(true).bucket_cap_mb(0.0005)
                                              .first_bucket_mb(0.0002));
    torch::optim::SGD opt(ddp.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    for (int s = 0; s < kSteps; ++s) {
      ddp.prepare_forward();
      ddp.sync_every_backward();
      opt.zero_grad();
      auto loss = torch::mse_loss(model->forward(data.input(s, g.rank(), kPerRank), use_head(s, g.rank())),
                                  data.target(s, g.rank(), kPerRank));
      (loss / 2).backward({}, /*retain_graph=*/true);
      (loss / 2).backward();
      if (s == 0) EXPECT_FALSE(model->fc3->weight.grad().defined()) << "no rank used the head";
      opt.step();
    }
    double w = 0;
    EXPECT_TRUE(parameters_close(model->parameters(), expected, kTolerance, parameter_names(*model), &w))
        << "rank " << g.rank();
    worst.update(w);
  });
  std::cout << "[ sync_every_backward ] world " << world << ": max |diff| " << worst.value << "\n";
}

// A parameter registered after wrapping lies in no bucket and would never be averaged: refused by
// name at the next forward; so is a module put in the place of a wrapped one.
TEST(DDP, AParameterRegisteredAfterWrappingIsRefusedByName) {
  single_threaded();
  run_ranks(2, [](ProcessGroup& g) {
    torch::nn::Sequential model(torch::nn::Linear(8, 6), torch::nn::ReLU(), torch::nn::Linear(6, 1));
    DistributedDataParallel ddp(model.ptr(), g);
    ddp.forward(torch::randn({4, 8})).sum().backward();
    model->ptr(2)->register_parameter("scale", torch::ones({1}));
    try {
      ddp.forward(torch::randn({4, 8}));
      ADD_FAILURE() << "no error";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("DistributedDataParallel: parameter '2.scale' was registered on the module "
                                           "after it was wrapped"),
                std::string::npos)
          << e.what();
    }
    torch::nn::Sequential other(torch::nn::Linear(8, 6));
    DistributedDataParallel replaced(other.ptr(), g);
    other->replace_module("0", torch::nn::Linear(8, 6));
    try {
      replaced.forward(torch::randn({4, 8}));
      ADD_FAILURE() << "no error";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("parameter '0.weight' was replaced on the module"), std::string::npos)
          << e.what();
    }
  });
}

}  // namespace
}  // namespace ddp_test
}  // namespace distributed
}  // namespace lockstep
