#include <lockstep/distributed/ddp/separate_ddp.h>

#include <mutex>

#include <gtest/gtest.h>

#include <lockstep/core/error.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <lockstep/distributed/collectives.h>

#include "../../../support/parity.h"
#include "../../../support/thread_ranks.h"

namespace lockstep {
namespace distributed {
namespace separate_ddp_test {
namespace {

using lockstep::testing::clone_all;
using lockstep::testing::copy_into;
using lockstep::testing::parameter_names;
using lockstep::testing::parameters_close;
using lockstep::testing::run_ranks;

constexpr double kTolerance = 1e-6;
constexpr int kSteps = 6;
constexpr int64_t kPerRank = 4;

struct GeneratorImpl : torch::nn::Module {
  GeneratorImpl() : fc1(register_module("fc1", torch::nn::Linear(4, 16))), fc2(register_module("fc2", torch::nn::Linear(16, 8))) {}
  torch::Tensor forward(const torch::Tensor& z) { return fc2(torch::relu(fc1(z))); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Generator);

struct DiscriminatorImpl : torch::nn::Module {
  DiscriminatorImpl() : fc1(register_module("fc1", torch::nn::Linear(8, 16))), fc2(register_module("fc2", torch::nn::Linear(16, 1))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::leaky_relu(fc1(x), 0.2)); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Discriminator);

// A GAN as MMEditing builds one: the parts are children; `activation` has no parameters.
struct GanImpl : torch::nn::Module {
  GanImpl()
      : generator(register_module("generator", Generator())),
        activation(register_module("activation", torch::nn::Tanh())),
        discriminator(register_module("discriminator", Discriminator())) {}
  // For one DDP around the whole GAN: the discriminator step's logits on real and fake data.
  std::vector<torch::Tensor> forward(const torch::Tensor& real, const torch::Tensor& z) {
    auto fake = activation(generator(z)).detach();
    return {discriminator(real), discriminator(fake)};
  }
  Generator generator;
  torch::nn::Tanh activation;
  Discriminator discriminator;
};
TORCH_MODULE(Gan);

struct GanData {
  std::vector<at::Tensor> real, noise;  // per step, all ranks' rows
  explicit GanData(int64_t rows) {
    auto gen = at::detail::createCPUGenerator(17);
    for (int s = 0; s < kSteps; ++s) {
      real.push_back(at::randn({rows, 8}, gen) * 0.5 + 1);
      noise.push_back(at::randn({rows, 4}, gen));
    }
  }
};

at::Tensor bce(const at::Tensor& logits, double label) {
  return torch::binary_cross_entropy_with_logits(logits, torch::full_like(logits, label));
}

// One alternating step; G, D and A are callables (plain modules or SeparateDDP children);
// `arm(loss)` runs before each backward.
template <typename G, typename A, typename D, typename Arm = void (*)(const at::Tensor&)>
void gan_step(G&& gen, A&& act, D&& disc, torch::optim::Optimizer& opt_g, torch::optim::Optimizer& opt_d,
              const at::Tensor& real, const at::Tensor& z, Arm&& arm = [](const at::Tensor&) {}) {
  // Discriminator step: the generator's output is detached, so the generator gets no gradient.
  auto fake = act(gen(z)).detach();
  auto d_loss = bce(disc(real), 1.0) + bce(disc(fake), 0.0);
  opt_d.zero_grad();
  arm(d_loss);
  d_loss.backward();
  opt_d.step();
  // Generator step.
  auto g_loss = bce(disc(act(gen(z))), 1.0);
  opt_g.zero_grad();
  arm(g_loss);
  g_loss.backward();
  opt_g.step();
}

std::unique_ptr<torch::optim::Adam> adam(std::vector<at::Tensor> params) {
  return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(2e-3).betas({0.5, 0.999}));
}

std::vector<at::Tensor> initial_gan() {
  torch::manual_seed(31);
  return clone_all(Gan()->parameters());
}

// The parameters after kSteps alternating steps of one process on the whole batch.
std::vector<at::Tensor> one_process(const std::vector<at::Tensor>& init, const GanData& data) {
  Gan ref;
  copy_into(ref->parameters(), init);
  auto ref_g = adam(ref->generator->parameters());
  auto ref_d = adam(ref->discriminator->parameters());
  for (int s = 0; s < kSteps; ++s) {
    gan_step(ref->generator, ref->activation, ref->discriminator, *ref_g, *ref_d, data.real[s], data.noise[s]);
  }
  return clone_all(ref->parameters());
}

// 2 ranks of a GAN against one process on both ranks' rows: the starting point, the data and
// the parameters every rank must end with.
class SeparateDDPGan : public ::testing::Test {
 protected:
  void SetUp() override { torch::set_num_threads(1); }
  // This rank's rows of step s.
  at::Tensor real(int s, const ProcessGroup& g) const { return data.real[s].narrow(0, g.rank() * kPerRank, kPerRank); }
  at::Tensor noise(int s, const ProcessGroup& g) const { return data.noise[s].narrow(0, g.rank() * kPerRank, kPerRank); }

  const int world = 2;
  const std::vector<at::Tensor> init = initial_gan();
  const GanData data{world * kPerRank};
  const std::vector<at::Tensor> expected = one_process(init, data);
};

TEST_F(SeparateDDPGan, GanTrainsAlternatelyAndReplicasStayIdentical) {
  lockstep::testing::Worst worst_ref, worst_ranks;
  run_ranks(world, [&](ProcessGroup& g) {
    Gan gan;
    if (g.rank() == 0) copy_into(gan->parameters(), init);
    SeparateDDP sep(gan, g);
    EXPECT_EQ(sep.children(), (std::vector<std::string>{"generator", "activation", "discriminator"}));
    EXPECT_TRUE(sep.is_wrapped("generator"));
    EXPECT_FALSE(sep.is_wrapped("activation"));
    EXPECT_TRUE(sep.is_wrapped("discriminator"));
    auto G = sep.module<GeneratorImpl>("generator");
    auto A = sep.module<torch::nn::TanhImpl>("activation");
    auto D = sep.module<DiscriminatorImpl>("discriminator");
    EXPECT_EQ(A.ddp(), nullptr);
    auto opt_g = adam(G->parameters());
    auto opt_d = adam(D->parameters());
    for (int s = 0; s < kSteps; ++s) gan_step(G, A, D, *opt_g, *opt_d, real(s, g), noise(s, g));
    double w = 0;
    EXPECT_TRUE(parameters_close(gan->parameters(), expected, kTolerance, parameter_names(*gan), &w)) << "rank " << g.rank();
    // Replicas: bit-identical across ranks.
    std::vector<at::Tensor> flat;
    for (const auto& p : gan->parameters()) flat.push_back(p.detach().reshape({-1}));
    const auto gathered = all_gather(g, torch::cat(flat));
    const double across = (gathered[0] - gathered[1]).abs().max().item<double>();
    EXPECT_EQ(across, 0.0) << "rank " << g.rank();
    worst_ref.update(w);
    worst_ranks.update(across);
  });
  std::cout << "[ separate_ddp GAN ] 2 ranks, " << kSteps << " alternating Adam steps: max |diff| vs one process "
            << worst_ref.value << ", across ranks " << worst_ranks.value << "\n";
}

// Children called directly, as a Trainer step does under --strategy ddp_separate: prepare_forward()
// once per step, arm_for_backward(loss) before each backward arms only the parts the loss reaches.
TEST_F(SeparateDDPGan, DirectCallsArmOnlyThePartsTheLossReaches) {
  lockstep::testing::Worst worst;
  run_ranks(world, [&](ProcessGroup& g) {
    Gan gan;
    if (g.rank() == 0) copy_into(gan->parameters(), init);
    SeparateDDP sep(gan, g);
    auto opt_g = adam(gan->generator->parameters());
    auto opt_d = adam(gan->discriminator->parameters());
    for (int s = 0; s < kSteps; ++s) {
      sep.prepare_forward();
      gan_step(gan->generator, gan->activation, gan->discriminator, *opt_g, *opt_d, real(s, g), noise(s, g),
               [&](const at::Tensor& loss) { sep.arm_for_backward(loss); });
    }
    double w = 0;
    EXPECT_TRUE(parameters_close(gan->parameters(), expected, kTolerance, parameter_names(*gan), &w)) << "rank " << g.rank();
    worst.update(w);
    // The discriminator step's loss does not reach the generator: the generator reduced once
    // per step, the discriminator twice (its own step, and the generator step's backward).
    EXPECT_EQ(sep.ddp("generator").last_trace().step, kSteps);
    EXPECT_EQ(sep.ddp("discriminator").last_trace().step, 2 * kSteps);
  });
  std::cout << "[ separate_ddp direct calls ] max |diff| vs one process " << worst.value << "\n";
}

// MMGeneration's docs: one DDP around the whole GAN fails, because the discriminator step leaves
// the generator's parameters without gradients.
TEST(SeparateDDP, OneDDPAroundTheWholeGanFailsClearly) {
  torch::set_num_threads(1);
  const GanData data(2 * kPerRank);
  std::mutex mutex;
  std::vector<std::string> backward_errors, next_errors;
  run_ranks(2, [&](ProcessGroup& g) {
    Gan gan;
    DistributedDataParallel ddp(gan, g);
    auto opt_d = adam(gan->discriminator->parameters());
    const auto real = data.real[0].narrow(0, g.rank() * kPerRank, kPerRank);
    const auto z = data.noise[0].narrow(0, g.rank() * kPerRank, kPerRank);
    try {
      auto logits = ddp.forward(real, z);
      (bce(logits[0], 1.0) + bce(logits[1], 0.0)).backward();
      ADD_FAILURE() << "rank " << g.rank() << ": the discriminator step did not fail";
    } catch (const DistributedError& e) {
      std::lock_guard<std::mutex> lock(mutex);
      backward_errors.push_back(e.what());
    }
    try {
      ddp.forward(real, z);
      ADD_FAILURE() << "rank " << g.rank() << ": the next forward did not fail";
    } catch (const DistributedError& e) {
      std::lock_guard<std::mutex> lock(mutex);
      next_errors.push_back(e.what());
    }
  });
  ASSERT_EQ(backward_errors.size(), 2u);
  for (const auto& m : backward_errors) {
    EXPECT_NE(m.find("parameters were not used in producing loss: generator.fc1.weight, generator.fc1.bias, "
                     "generator.fc2.weight, generator.fc2.bias"),
              std::string::npos)
        << m;
    EXPECT_EQ(m.find("discriminator."), std::string::npos) << m;
    EXPECT_NE(m.find("find_unused_parameters(true)"), std::string::npos) << m;
  }
  ASSERT_EQ(next_errors.size(), 2u);
  for (const auto& m : next_errors) {
    EXPECT_NE(m.find("Expected to have finished reduction in the prior iteration before starting a new one"),
              std::string::npos)
        << m;
  }
  std::cout << "[ one DDP around the GAN ] " << backward_errors[0].substr(0, 200) << "...\n";
}

TEST(SeparateDDP, OneDevicePerProcess) {
  run_ranks(1, [](ProcessGroup& g) {
    Gan gan;
    try {
      SeparateDDP sep(gan, g, DDPOptions(), {torch::Device(torch::kCPU), torch::Device(torch::kCPU)});
      ADD_FAILURE() << "no error";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("one device per process, but got 2 device_ids (cpu, cpu)"),
                std::string::npos)
          << e.what();
    }
    if (!torch::cuda::is_available()) {
      try {
        SeparateDDP sep(gan, g, DDPOptions(), {torch::Device("cuda:0")});
        ADD_FAILURE() << "no error";
      } catch (const UsageError& e) {
        EXPECT_NE(std::string(e.what()).find("sees no CUDA device"), std::string::npos) << e.what();
      }
    }
  });
}

TEST(SeparateDDP, NamesAndTypesAreChecked) {
  run_ranks(1, [](ProcessGroup& g) {
    Gan gan;
    SeparateDDP sep(gan, g);
    EXPECT_THROW(sep.module<GeneratorImpl>("critic"), UsageError);
    try {
      sep.module<GeneratorImpl>("discriminator");
      ADD_FAILURE() << "no error";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("not a "), std::string::npos) << e.what();
    }
    try {
      sep.ddp("activation");
      ADD_FAILURE() << "no error";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("has no parameters"), std::string::npos) << e.what();
    }
    // Inputs are moved to the process's device (here the CPU), other arguments pass through.
    auto moved = sep.to_device(std::vector<at::Tensor>{torch::ones({2})});
    EXPECT_EQ(moved[0].device(), sep.device());
  });
}

struct RootParamImpl : torch::nn::Module {
  RootParamImpl() : fc(register_module("fc", torch::nn::Linear(2, 2))) { scale = register_parameter("scale", torch::ones({1})); }
  torch::nn::Linear fc;
  torch::Tensor scale;
};
TORCH_MODULE(RootParam);

TEST(SeparateDDP, RootParametersAreAnError) {
  run_ranks(1, [](ProcessGroup& g) {
    RootParam m;
    try {
      SeparateDDP sep(m, g);
      ADD_FAILURE() << "no error";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("('scale')"), std::string::npos) << e.what();
    }
  });
}

// As MMEditing's wrapper: by default each rank keeps its own buffers (no broadcast before each
// training forward); DDPOptions().broadcast_buffers(true) brings rank 0's back.
struct TwoNormsImpl : torch::nn::Module {
  TwoNormsImpl()
      : a(register_module("a", torch::nn::BatchNorm1d(torch::nn::BatchNormOptions(3).momentum(0.5)))),
        b(register_module("b", torch::nn::BatchNorm1d(3))) {}
  torch::nn::BatchNorm1d a, b;
};
TORCH_MODULE(TwoNorms);

TEST(SeparateDDP, EachRankKeepsItsOwnBuffersByDefault) {
  for (bool broadcast : {false, true}) {
    run_ranks(2, [&](ProcessGroup& g) {
      TwoNorms m;
      auto sep = broadcast ? std::make_unique<SeparateDDP>(m, g, DDPOptions().broadcast_buffers(true))
                           : std::make_unique<SeparateDDP>(m, g);
      {
        torch::NoGradGuard no_grad;
        m->a->running_var.fill_(g.rank() + 2.0);
      }
      // A training forward mixes this batch's variance (0) in by half.
      sep->module<torch::nn::BatchNorm1dImpl>("a")(torch::ones({2, 3}));
      const double expected = (broadcast ? 2.0 : g.rank() + 2.0) / 2;
      EXPECT_TRUE(m->a->running_var.allclose(torch::full({3}, expected)))
          << "broadcast " << broadcast << ", rank " << g.rank() << ": " << m->a->running_var;
    });
  }
}

// DDPOptions passed for another reason (a bucket size) leave broadcast_buffers unset, which
// SeparateDDP takes as its own default (false), and plain DistributedDataParallel as PyTorch's
// (true); options() says which applied.
TEST(SeparateDDP, OptionsGivenForAnotherReasonKeepEachWrappersBufferDefault) {
  run_ranks(2, [&](ProcessGroup& g) {
    TwoNorms m;
    SeparateDDP sep(m, g, DDPOptions().bucket_cap_mb(10));
    EXPECT_EQ(sep.ddp("a").options().broadcast_buffers(), std::optional<bool>(false));
    EXPECT_EQ(sep.ddp("a").options().bucket_cap_mb(), 10);
    {
      torch::NoGradGuard no_grad;
      m->a->running_var.fill_(g.rank() + 2.0);
    }
    sep.module<torch::nn::BatchNorm1dImpl>("a")(torch::ones({2, 3}));
    EXPECT_TRUE(m->a->running_var.allclose(torch::full({3}, (g.rank() + 2.0) / 2)))
        << "rank " << g.rank() << " must keep its own statistics: " << m->a->running_var;

    auto plain = torch::nn::BatchNorm1d(torch::nn::BatchNormOptions(3).momentum(0.5));
    DistributedDataParallel ddp(plain, g, DDPOptions().bucket_cap_mb(10));
    EXPECT_EQ(ddp.options().broadcast_buffers(), std::optional<bool>(true));
    {
      torch::NoGradGuard no_grad;
      plain->running_var.fill_(g.rank() + 2.0);
    }
    ddp.forward(torch::ones({2, 3}));
    EXPECT_TRUE(plain->running_var.allclose(torch::full({3}, 1.0)))
        << "rank " << g.rank() << " must take rank 0's statistics: " << plain->running_var;
  });
}

// A part registered after wrapping would have no DistributedDataParallel: refused by name at the
// next prepare_forward().
TEST(SeparateDDP, APartRegisteredAfterWrappingIsRefusedByName) {
  run_ranks(2, [&](ProcessGroup& g) {
    Gan gan;
    SeparateDDP sep(gan, g);
    sep.prepare_forward();
    gan->register_module("critic", Discriminator());
    try {
      sep.prepare_forward();
      ADD_FAILURE() << "no error";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("SeparateDDP: parameter 'critic.fc1.weight' was registered on the module "
                                           "after it was wrapped"),
                std::string::npos)
          << e.what();
    }
  });
}

}  // namespace
}  // namespace separate_ddp_test
}  // namespace distributed
}  // namespace lockstep
