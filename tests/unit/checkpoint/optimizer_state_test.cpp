#include <lockstep/checkpoint/checkpoint_io.h>
#include <lockstep/checkpoint/optimizer_state.h>
#include <lockstep/checkpoint/state_dict.h>
#include <lockstep/core/error.h>

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <memory>

#include <torch/torch.h>
#include "../../support/errors.h"

namespace lockstep {
namespace checkpoint {
namespace optimizer_state_test {
namespace {

namespace fs = std::filesystem;

struct Net : torch::nn::Module {
  Net() : fc1(register_module("fc1", torch::nn::Linear(5, 8))), fc2(register_module("fc2", torch::nn::Linear(8, 3))) {}
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::tanh(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};

using MakeOptimizer = std::function<std::unique_ptr<torch::optim::Optimizer>(Net&, double lr)>;

// Steps `from`..`to` on batches that depend only on the step number, so a resumed run sees the
// same data as an uninterrupted one.
void train(Net& net, torch::optim::Optimizer& optimizer, int from, int to) {
  for (int step = from; step < to; ++step) {
    torch::manual_seed(1000 + step);
    const auto x = torch::randn({16, 5});
    const auto y = torch::randn({16, 3});
    optimizer.zero_grad();
    torch::mse_loss(net.forward(x), y).backward();
    optimizer.step();
  }
}

struct Case {
  std::string name;
  MakeOptimizer make;
};

class ResumeTest : public ::testing::TestWithParam<Case> {};

// Six steps in one go equal three steps, a checkpoint file, a fresh model and optimizer (built
// with a different learning rate, which the checkpoint overrides), and three more steps.
TEST_P(ResumeTest, ResumeIsBitExact) {
  const auto& make = GetParam().make;
  torch::manual_seed(7);
  Net straight;
  Net resumed_source;
  load_state_dict(resumed_source, state_dict(straight));
  auto straight_opt = make(straight, 0.05);
  train(straight, *straight_opt, 0, 6);

  auto first_opt = make(resumed_source, 0.05);
  train(resumed_source, *first_opt, 0, 3);
  auto ckpt = make_checkpoint();
  ckpt.insert("state_dict", state_dict(resumed_source));
  ckpt.insert("optimizer", optimizer_state_dict(*first_opt));
  const std::string path = "/tmp/lockstep_resume_" + std::to_string(::getpid()) + ".ckpt";
  CheckpointIO().save(ckpt, path);
  const auto loaded = CheckpointIO().load(path);
  fs::remove(path);

  Net resumed;
  auto resumed_opt = make(resumed, 0.5);
  load_state_dict(resumed, loaded.at("state_dict").toGenericDict());
  load_optimizer_state_dict(*resumed_opt, loaded.at("optimizer").toGenericDict());
  EXPECT_EQ(resumed_opt->param_groups()[0].options().get_lr(), 0.05);
  train(resumed, *resumed_opt, 3, 6);

  const auto a = state_dict(straight), b = state_dict(resumed);
  for (const auto& entry : a) {
    EXPECT_TRUE(torch::equal(entry.value(), b.at(entry.key())))
        << entry.key() << " differs by up to " << (entry.value() - b.at(entry.key())).abs().max().item<double>();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Optimizers, ResumeTest,
    ::testing::Values(
        Case{"sgd_momentum_nesterov",
             [](Net& n, double lr) -> std::unique_ptr<torch::optim::Optimizer> {
               return std::make_unique<torch::optim::SGD>(
                   n.parameters(), torch::optim::SGDOptions(lr).momentum(0.9).nesterov(true).weight_decay(1e-4));
             }},
        Case{"sgd_dampening",
             [](Net& n, double lr) -> std::unique_ptr<torch::optim::Optimizer> {
               return std::make_unique<torch::optim::SGD>(n.parameters(),
                                                          torch::optim::SGDOptions(lr).momentum(0.5).dampening(0.1));
             }},
        Case{"adam",
             [](Net& n, double lr) -> std::unique_ptr<torch::optim::Optimizer> {
               return std::make_unique<torch::optim::Adam>(n.parameters(), torch::optim::AdamOptions(lr));
             }},
        Case{"adam_amsgrad",
             [](Net& n, double lr) -> std::unique_ptr<torch::optim::Optimizer> {
               return std::make_unique<torch::optim::Adam>(
                   n.parameters(), torch::optim::AdamOptions(lr).amsgrad(true).betas({0.8, 0.99}).weight_decay(0.01));
             }},
        Case{"adamw",
             [](Net& n, double lr) -> std::unique_ptr<torch::optim::Optimizer> {
               return std::make_unique<torch::optim::AdamW>(n.parameters(), torch::optim::AdamWOptions(lr));
             }}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

TEST(OptimizerStateTest, SgdLayoutIsPythons) {
  Net net;
  torch::optim::SGD sgd(net.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  train(net, sgd, 0, 1);
  const auto dict = optimizer_state_dict(sgd);
  const auto group = dict.at("param_groups").toListRef()[0].toGenericDict();
  std::vector<std::string> names;
  for (const auto& entry : group) names.push_back(entry.key().toStringRef());
  EXPECT_EQ(names, (std::vector<std::string>{"lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize",
                                             "foreach", "differentiable", "params"}));
  EXPECT_EQ(group.at("lr").toDouble(), 0.1);
  EXPECT_EQ(group.at("params").toIntVector(), (std::vector<int64_t>{0, 1, 2, 3}));
  const auto state = dict.at("state").toGenericDict();
  ASSERT_EQ(state.size(), 4u);
  const auto buffer = state.at(int64_t{2}).toGenericDict().at("momentum_buffer").toTensor();
  EXPECT_EQ(buffer.sizes(), net.fc2->weight.sizes());
}

TEST(OptimizerStateTest, SgdWithoutMomentumHasNoState) {
  Net net;
  torch::optim::SGD sgd(net.parameters(), torch::optim::SGDOptions(0.1));
  train(net, sgd, 0, 2);
  EXPECT_EQ(optimizer_state_dict(sgd).at("state").toGenericDict().size(), 0u);
}

TEST(OptimizerStateTest, AdamLayoutIsPythons) {
  Net net;
  torch::optim::Adam adam(net.parameters(), torch::optim::AdamOptions(1e-3).betas({0.8, 0.9}));
  train(net, adam, 0, 3);
  const auto dict = optimizer_state_dict(adam);
  const auto group = dict.at("param_groups").toListRef()[0].toGenericDict();
  const auto& betas = group.at("betas").toTupleRef().elements();
  EXPECT_EQ(betas[0].toDouble(), 0.8);
  EXPECT_EQ(betas[1].toDouble(), 0.9);
  const auto first = dict.at("state").toGenericDict().at(int64_t{0}).toGenericDict();
  EXPECT_EQ(first.at("step").toTensor().item<double>(), 3.0);
  EXPECT_TRUE(first.contains("exp_avg"));
  EXPECT_TRUE(first.contains("exp_avg_sq"));
  EXPECT_FALSE(first.contains("max_exp_avg_sq"));
}

TEST(OptimizerStateTest, ParameterGroupsAreNumberedInOrderAndRestoredEach) {
  Net net;
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(net.fc1->parameters(), std::make_unique<torch::optim::SGDOptions>(0.1));
  groups.emplace_back(net.fc2->parameters(), std::make_unique<torch::optim::SGDOptions>(0.01));
  torch::optim::SGD sgd(groups, torch::optim::SGDOptions(0.1).momentum(0.9));
  const auto dict = optimizer_state_dict(sgd);
  const auto saved = dict.at("param_groups").toListRef();
  ASSERT_EQ(saved.size(), 2u);
  EXPECT_EQ(saved[1].toGenericDict().at("params").toIntVector(), (std::vector<int64_t>{2, 3}));

  std::vector<torch::optim::OptimizerParamGroup> other;
  other.emplace_back(net.fc1->parameters(), std::make_unique<torch::optim::SGDOptions>(1.0));
  other.emplace_back(net.fc2->parameters(), std::make_unique<torch::optim::SGDOptions>(2.0));
  torch::optim::SGD restored(other, torch::optim::SGDOptions(1.0));
  load_optimizer_state_dict(restored, dict);
  EXPECT_EQ(restored.param_groups()[0].options().get_lr(), 0.1);
  EXPECT_EQ(restored.param_groups()[1].options().get_lr(), 0.01);
}

TEST(OptimizerStateTest, MismatchesAreUsageErrorsThatChangeNothing) {
  Net net;
  torch::optim::SGD sgd(net.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  train(net, sgd, 0, 1);
  const auto sgd_state = optimizer_state_dict(sgd);

  torch::optim::Adam adam(net.parameters(), torch::optim::AdamOptions(0.003));
  train(net, adam, 0, 1);
  std::string message = testing::error_of([&] { load_optimizer_state_dict(adam, sgd_state); });
  EXPECT_NE(message.find("param_groups[0] lacks \"betas\""), std::string::npos) << message;
  EXPECT_NE(message.find("same optimizer"), std::string::npos) << message;
  EXPECT_EQ(adam.param_groups()[0].options().get_lr(), 0.003);
  EXPECT_EQ(adam.state().size(), 4u);

  torch::optim::SGD fewer(net.fc1->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  message = testing::error_of([&] { load_optimizer_state_dict(fewer, sgd_state); });
  EXPECT_NE(message.find("param_groups[0] has 4 parameters in the checkpoint and 2 in the optimizer"), std::string::npos)
      << message;

  torch::optim::RMSprop rmsprop(net.parameters(), torch::optim::RMSpropOptions(0.1));
  message = testing::error_of([&] { optimizer_state_dict(rmsprop); });
  EXPECT_NE(message.find("RMSprop is not supported"), std::string::npos) << message;
}

TEST(OptimizerStateTest, MomentumBufferShapeMismatchIsAnError) {
  Net net;
  torch::optim::SGD sgd(net.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  train(net, sgd, 0, 1);
  auto dict = optimizer_state_dict(sgd);
  auto state = dict.at("state").toGenericDict();
  auto first = state.at(int64_t{0}).toGenericDict();
  first.insert_or_assign("momentum_buffer", torch::zeros({2, 2}));
  const std::string message = testing::error_of([&] { load_optimizer_state_dict(sgd, dict); });
  EXPECT_NE(message.find("state[0][\"momentum_buffer\"] has shape [2, 2] but its parameter has shape [8, 5]"),
            std::string::npos)
      << message;
}

}  // namespace
}  // namespace optimizer_state_test
}  // namespace checkpoint
}  // namespace lockstep
