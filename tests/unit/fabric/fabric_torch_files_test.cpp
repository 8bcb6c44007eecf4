// Fabric's load_raw and load on files that Python's torch.save wrote (torch 1.13 here): a
// state_dict, one whose names carry a wrapper's prefix, and Python Fabric's {"model": ..., "step": ...}.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <lockstep/checkpoint/key_map.h>
#include <lockstep/core/error.h>
#include <lockstep/fabric/fabric.h>

#include "../../support/paths.h"
#include "../../support/python_files.h"
#include "../../support/temp_dir.h"

namespace lockstep {
namespace fabric_torch_files_test {

const char* const kPythonWriter = R"(
import sys, torch
d = sys.argv[1]
torch.manual_seed(5)
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 1)
    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))
class Wrapper(torch.nn.Module):
    def __init__(self, net):
        super().__init__()
        self.net = net
net = Net()
torch.save(net.state_dict(), d + "/weights.pt")
torch.save(Wrapper(net).state_dict(), d + "/wrapped.pt")
torch.save({"model": net.state_dict(), "step": 7}, d + "/fabric.ckpt")
with torch.no_grad():
    y = net(torch.linspace(-1, 1, 24).reshape(3, 8))
print(" ".join(float(v).hex() for v in y.flatten().tolist()))
)";

struct Net : torch::nn::Module {
  Net() {
    fc1 = register_module("fc1", torch::nn::Linear(8, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 1));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

class FabricTorchFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto files = testing::python_files(kPythonWriter, dir.path());
    if (!files.has_torch) GTEST_SKIP() << LOCKSTEP_TEST_PYTHON << " has no torch (apt-get install python3-torch)";
    ASSERT_EQ(files.command.exit_code, 0) << files.command.out << files.command.err;
    python_output = files.printed;
    ASSERT_EQ(python_output.size(), 3u) << files.command.out;
    fabric.launch();
  }

  double output_difference(Net& net) {
    torch::NoGradGuard no_grad;
    const auto y = net.forward(torch::linspace(-1, 1, 24).reshape({3, 8})).flatten();
    return (y - torch::tensor(python_output)).abs().max().item<double>();
  }

  testing::TempDir dir{"lockstep_fabric_torch"};
  std::vector<float> python_output;
  Fabric fabric{FabricOptions().devices("1").accelerator("cpu")};
};

TEST_F(FabricTorchFiles, LoadRawReadsPythonsStateDictAndTheModelComputesPythonsOutput) {
  auto net = std::make_shared<Net>();
  auto model = fabric.setup_module(net);
  const double before = output_difference(*net);
  fabric.load_raw(dir / "weights.pt", model);
  const double after = output_difference(*net);
  std::cout << "max |C++ output - Python output| after load_raw = " << after << " (before: " << before << ")\n";
  EXPECT_GT(before, 1e-3) << "the C++ model started with Python's weights: the test shows nothing";
  EXPECT_LE(after, 1e-6);
}

TEST_F(FabricTorchFiles, LoadRawMapsAWrappersPrefixWithAKeyMapAndNamesItWithout) {
  auto net = std::make_shared<Net>();
  try {
    fabric.load_raw(dir / "wrapped.pt", net);
    ADD_FAILURE() << "names with a prefix loaded without a KeyMap";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("KeyMap().rename_prefix(\"net.\", \"\")"), std::string::npos) << e.what();
  }
  fabric.load_raw(dir / "wrapped.pt", net, true, checkpoint::KeyMap().rename_prefix("net.", ""));
  EXPECT_LE(output_difference(*net), 1e-6);
}

TEST_F(FabricTorchFiles, LoadRestoresPythonFabricsCheckpointByKey) {
  auto net = std::make_shared<Net>();
  FabricState state{{"model", net}, {"step", int64_t{0}}};
  const auto rest = fabric.load(dir / "fabric.ckpt", state);
  EXPECT_TRUE(rest.empty());
  EXPECT_EQ(state.at("step").value().toInt(), 7);
  EXPECT_LE(output_difference(*net), 1e-6);
}

}  // namespace fabric_torch_files_test
}  // namespace lockstep
