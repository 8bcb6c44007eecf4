// Fabric's save, load and load_raw with safetensors (checkpoint/safetensors.h): a path ending in
// ".safetensors" or ".safetensors.index.json" writes one module's state_dict, and load and
// load_raw read it back (load_raw with a KeyMap); a state with more than one module's weights is
// refused by name.
#include <gtest/gtest.h>

#include <filesystem>

#include <torch/torch.h>

#include <lockstep/checkpoint/key_map.h>
#include <lockstep/checkpoint/safetensors.h>
#include <lockstep/core/error.h>
#include <lockstep/fabric/fabric.h>

#include "../../support/temp_dir.h"

namespace lockstep {
namespace fabric_safetensors_test {

struct Net : torch::nn::Module {
  Net() {
    fc1 = register_module("fc1", torch::nn::Linear(8, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 1));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

class FabricSafetensors : public ::testing::Test {
 protected:
  void SetUp() override { fabric.launch(); }

  static bool same_outputs(Net& a, Net& b) {
    torch::NoGradGuard no_grad;
    const auto x = torch::linspace(-1, 1, 24).reshape({3, 8});
    return torch::equal(a.forward(x), b.forward(x));
  }

  std::string save_error(const FabricState& state, const std::string& name) {
    try {
      fabric.save(dir / name, state);
    } catch (const UsageError& e) {
      return e.what();
    }
    return "(no UsageError)";
  }

  testing::TempDir dir{"lockstep_fabric_safetensors"};
  Fabric fabric{FabricOptions().devices("1").accelerator("cpu")};
};

TEST_F(FabricSafetensors, SaveWritesTheModulesStateDictAndLoadRawReadsItBack) {
  torch::manual_seed(3);
  auto net = std::make_shared<Net>();
  auto model = fabric.setup_module(net);
  fabric.save(dir / "model.safetensors", {{"model", model}});
  const auto file = checkpoint::load_safetensors(dir / "model.safetensors");
  std::vector<std::string> names;
  for (const auto& item : file.tensors) names.push_back(item.key());
  EXPECT_EQ(names, (std::vector<std::string>{"fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"}));
  EXPECT_EQ(file.metadata.at("format"), "pt");  // as transformers' save_pretrained writes it
  auto fresh = std::make_shared<Net>();
  EXPECT_FALSE(same_outputs(*net, *fresh));
  fabric.load_raw(dir / "model.safetensors", fresh);
  EXPECT_TRUE(same_outputs(*net, *fresh));
  auto loaded = std::make_shared<Net>();  // load() of the state that save() was given
  FabricState state{{"model", loaded}};
  EXPECT_TRUE(fabric.load(dir / "model.safetensors", state).empty());
  EXPECT_TRUE(same_outputs(*net, *loaded));
  // Hugging Face's sharded form, by the index's name.
  auto again = std::make_shared<Net>();
  fabric.save(dir / "sharded/model.safetensors.index.json", {{"model", model}});
  EXPECT_TRUE(std::filesystem::exists(dir / "sharded/model-00001-of-00001.safetensors"));
  fabric.load_raw(dir / "sharded/model.safetensors.index.json", again);
  EXPECT_TRUE(same_outputs(*net, *again));
}

TEST_F(FabricSafetensors, LoadRawMapsPrefixedNamesWithAKeyMap) {
  auto net = std::make_shared<Net>();
  c10::Dict<std::string, torch::Tensor> prefixed;
  for (const auto& item : net->named_parameters()) prefixed.insert("model." + item.key(), item.value().detach());
  checkpoint::save_safetensors(prefixed, dir / "lit.safetensors");
  auto fresh = std::make_shared<Net>();
  try {
    fabric.load_raw(dir / "lit.safetensors", fresh);
    ADD_FAILURE() << "prefixed names loaded without a KeyMap";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("KeyMap().rename_prefix(\"model.\", \"\")"), std::string::npos) << e.what();
  }
  fabric.load_raw(dir / "lit.safetensors", fresh, true, checkpoint::KeyMap().rename_prefix("model.", ""));
  EXPECT_TRUE(same_outputs(*net, *fresh));
}

TEST_F(FabricSafetensors, SaveKeepsWhatTheFilterKeeps) {
  auto net = std::make_shared<Net>();
  fabric.save(dir / "fc2.safetensors", {{"model", net}},
              {{"model", [](const std::string& name, const torch::Tensor&) { return name.rfind("fc2.", 0) == 0; }}});
  EXPECT_EQ(checkpoint::load_safetensors(dir / "fc2.safetensors").tensors.size(), 2u);
}

TEST_F(FabricSafetensors, AnOptimizerAValueOrASecondModuleIsRefusedByName) {
  auto net = std::make_shared<Net>();
  auto other = std::make_shared<Net>();
  auto sgd = std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.1));
  const std::string with_optimizer = save_error({{"model", net}, {"optimizer", sgd}, {"step", int64_t{3}}}, "a.safetensors");
  for (const char* part : {"a .safetensors file holds one module's weights and nothing else",
                           "'optimizer' (an optimizer), 'step' (a value)", "the whole state to a .ckpt file"}) {
    EXPECT_NE(with_optimizer.find(part), std::string::npos) << with_optimizer;
  }
  const std::string two = save_error({{"student", net}, {"teacher", other}}, "b.safetensors");
  EXPECT_NE(two.find("the state holds 'student', 'teacher'. Save each module to a file of its own"), std::string::npos)
      << two;
  EXPECT_FALSE(std::filesystem::exists(dir / "a.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(dir / "b.safetensors"));
  fabric.save(dir / "net.safetensors", {{"model", net}});
  FabricState with_step{{"model", net}, {"step", int64_t{0}}};
  try {
    fabric.load(dir / "net.safetensors", with_step);
    ADD_FAILURE() << "loaded";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("Fabric::load(\"" + dir / "net.safetensors" + "\"): a .safetensors file holds "
                                         "one module's weights and nothing else, and the state also holds 'step' (a value)"),
              std::string::npos) << e.what();
  }
}

}  // namespace fabric_safetensors_test
}  // namespace lockstep
