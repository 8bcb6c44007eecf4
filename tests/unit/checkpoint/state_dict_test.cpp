#include <lockstep/checkpoint/state_dict.h>
#include <lockstep/core/error.h>

#include <gtest/gtest.h>

#include <torch/torch.h>
#include "../../support/errors.h"

namespace lockstep {
namespace checkpoint {
namespace state_dict_test {
namespace {

// The same layers as this Python module, whose state_dict() keys the first test expects:
//   fc1 = Linear(3, 4); scale = Parameter(ones(1)); bn = BatchNorm1d(4)
//   register_buffer("counter", zeros(1)); block = Sequential(Linear(4, 4), ReLU(), Linear(4, 2, bias=False))
struct Net : torch::nn::Module {
  explicit Net(int64_t out = 2)
      : fc1(register_module("fc1", torch::nn::Linear(3, 4))),
        bn(register_module("bn", torch::nn::BatchNorm1d(4))),
        block(register_module("block", torch::nn::Sequential(torch::nn::Linear(4, 4), torch::nn::ReLU(),
                                                             torch::nn::Linear(torch::nn::LinearOptions(4, out).bias(false))))) {
    scale = register_parameter("scale", torch::ones({1}));
    counter = register_buffer("counter", torch::zeros({1}));
  }
  torch::nn::Linear fc1;
  torch::nn::BatchNorm1d bn;
  torch::nn::Sequential block;
  torch::Tensor scale, counter;
};

std::vector<std::string> keys(const c10::Dict<std::string, torch::Tensor>& dict) {
  std::vector<std::string> out;
  for (const auto& entry : dict) out.push_back(entry.key());
  return out;
}

TEST(StateDictTest, KeysAndOrderAreThoseOfPython) {
  Net net;
  const std::vector<std::string> python{"scale",        "counter",     "fc1.weight",      "fc1.bias",
                                        "bn.weight",    "bn.bias",     "bn.running_mean", "bn.running_var",
                                        "bn.num_batches_tracked",      "block.0.weight",  "block.0.bias",
                                        "block.2.weight"};
  EXPECT_EQ(keys(state_dict(net)), python);
}

TEST(StateDictTest, TensorsShareStorageButCarryNoGradient) {
  Net net;
  const auto sd = state_dict(net);
  EXPECT_FALSE(sd.at("fc1.weight").requires_grad());
  EXPECT_EQ(sd.at("fc1.weight").data_ptr(), net.fc1->weight.data_ptr());
  EXPECT_EQ(sd.at("bn.num_batches_tracked").scalar_type(), torch::kLong);
}

TEST(StateDictTest, LoadCopiesEveryParameterAndBuffer) {
  torch::manual_seed(1);
  Net source, target;
  source.bn->forward(torch::randn({5, 4}));  // moves running stats and num_batches_tracked
  const auto result = load_state_dict(target, state_dict(source));
  EXPECT_TRUE(result.missing_keys.empty());
  EXPECT_TRUE(result.unexpected_keys.empty());
  const auto a = state_dict(source), b = state_dict(target);
  for (const auto& entry : a) EXPECT_TRUE(torch::equal(entry.value(), b.at(entry.key()))) << entry.key();
  EXPECT_TRUE(target.fc1->weight.requires_grad());
  EXPECT_TRUE(target.fc1->weight.is_leaf());
}

TEST(StateDictTest, StrictLoadNamesMissingAndUnexpectedKeys) {
  Net source, target;
  auto sd = c10::impl::toGenericDict(state_dict(source));
  ASSERT_EQ(sd.erase("fc1.bias"), 1u);
  sd.insert("fc9.weight", torch::zeros({1}));
  const auto before = target.fc1->weight.clone();
  const std::string message = testing::error_of([&] { load_state_dict(target, sd); });
  EXPECT_NE(message.find("missing keys: fc1.bias"), std::string::npos) << message;
  EXPECT_NE(message.find("unexpected keys: fc9.weight"), std::string::npos) << message;
  EXPECT_NE(message.find("strict=false"), std::string::npos) << message;
  EXPECT_TRUE(torch::equal(before, target.fc1->weight)) << "nothing may be copied when loading fails";
}

TEST(StateDictTest, NonStrictLoadReportsAndLoadsTheRest) {
  Net source, target;
  auto sd = c10::impl::toGenericDict(state_dict(source));
  ASSERT_EQ(sd.erase("fc1.bias"), 1u);
  sd.insert("extra", torch::zeros({1}));
  const auto result = load_state_dict(target, sd, /*strict=*/false);
  EXPECT_EQ(result.missing_keys, std::vector<std::string>{"fc1.bias"});
  EXPECT_EQ(result.unexpected_keys, std::vector<std::string>{"extra"});
  EXPECT_TRUE(torch::equal(source.fc1->weight, target.fc1->weight));
}

TEST(StateDictTest, ShapeMismatchIsAnErrorEvenWhenNotStrict) {
  Net source(/*out=*/2), target(/*out=*/3);
  const std::string message = testing::error_of([&] { load_state_dict(target, state_dict(source), /*strict=*/false); });
  EXPECT_NE(message.find("size mismatch for block.2.weight: the checkpoint has [2, 4], the model [3, 4]"),
            std::string::npos)
      << message;
}

TEST(StateDictTest, NonTensorValueIsAnError) {
  Net source, target;
  auto sd = c10::impl::toGenericDict(state_dict(source));
  sd.insert_or_assign("scale", 1.5);
  const std::string message = testing::error_of([&] { load_state_dict(target, sd); });
  EXPECT_NE(message.find("scale holds a float, not a tensor"), std::string::npos) << message;
}

TEST(StateDictTest, ValuesAreConvertedToTheParameterDtype) {
  Net target;
  auto sd = c10::impl::toGenericDict(state_dict(target));
  sd.insert_or_assign("scale", torch::full({1}, 2.5, torch::kFloat64));
  load_state_dict(target, sd);
  EXPECT_EQ(target.scale.scalar_type(), torch::kFloat32);
  EXPECT_EQ(target.scale.item<float>(), 2.5f);
}

}  // namespace
}  // namespace state_dict_test
}  // namespace checkpoint
}  // namespace lockstep
