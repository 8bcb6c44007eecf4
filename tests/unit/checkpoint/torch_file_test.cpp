// Files that Python's torch.save writes (torch 1.13 here, the Python of this build's LibTorch),
// read by CheckpointIO::load: state_dicts (OrderedDicts with _metadata), nested dicts, and the
// refusals of what only Python can rebuild. Each file is written by the test's own Python run.
#include <lockstep/checkpoint/checkpoint_io.h>
#include <lockstep/checkpoint/key_map.h>
#include <lockstep/checkpoint/state_dict.h>
#include <lockstep/core/error.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>

#include <torch/torch.h>

#include "../../support/command.h"
#include "../../support/paths.h"
#include "../../support/temp_dir.h"

namespace lockstep {
namespace checkpoint {
namespace torch_file_test {

// The files, and the network's output on a fixed input printed as exact (hex) floats.
const char* const kPythonWriter = R"(
import sys, torch
d = sys.argv[1]
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
torch.save(net.state_dict(), d + "/state_dict.pt")
x = torch.linspace(-2, 2, 20).reshape(5, 4)
with torch.no_grad():
    y = net(x)
print("output", " ".join(float(v).hex() for v in y.flatten().tolist()))
class LitModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.model = net
torch.save(LitModel().state_dict(), d + "/prefixed.pt")
torch.save(net, d + "/module.pt")
torch.save({"p": torch.nn.Parameter(torch.ones(2))}, d + "/parameter.pt")
torch.save({"s": {1, 2}}, d + "/set.pt")
torch.save({"a": torch.ones(2)}, d + "/protocol4.pt", pickle_protocol=4)
shared = torch.arange(6.)
torch.save({"model": net.state_dict(), "epoch": 3, "lr": 0.25, "big": 2**40, "negative": -2**40 - 1,
            "name": "mlp", "flags": [True, None], "one": {"t": torch.arange(3)},
            "deep": {"a": {"b": {"c": torch.eye(2, dtype=torch.float64)}}}, "pair": (1, "x"),
            "view": torch.arange(10.)[2:8:2], "tied_a": shared, "tied_b": shared}, d + "/nested.pt")
import re, zipfile
def rewritten(name, pattern, replacement):
    source = zipfile.ZipFile(d + "/state_dict.pt")
    with zipfile.ZipFile(d + "/" + name, "w") as out:
        for record in source.namelist():
            data = source.read(record)
            if record.endswith("data.pkl"):
                data = re.sub(pattern, replacement, data, count=1, flags=re.S)
            out.writestr(record, data)
# 0.weight's storage says 255 floats (its record holds 32); its view starts at float 16 of 32.
rewritten("lying_storage.pt", rb"(X\x03\x00\x00\x00cpuq.)K.", lambda m: m.group(1) + b"K\xff")
rewritten("lying_view.pt", rb"QK\x00", lambda m: b"QK\x10")
print("version", torch.__version__)
)";

struct PythonFiles {
  std::unique_ptr<testing::TempDir> dir = std::make_unique<testing::TempDir>("lockstep_torch_file");
  std::vector<float> output;  // the network's output on x, row by row
  std::string skip;           // why there are none
  std::string operator/(const std::string& name) const { return *dir / name; }
};

// Written once per test process.
const PythonFiles& python_files() {
  static const PythonFiles files = [] {
    PythonFiles f;
    const auto result = testing::run_command({LOCKSTEP_TEST_PYTHON, "-c", kPythonWriter, f.dir->path()},
                                             {{"OMP_NUM_THREADS", "1"}, {"HOME", f.dir->path()}}, std::chrono::seconds(60));
    if (result.err.find("No module named 'torch'") != std::string::npos) {
      f.skip = std::string(LOCKSTEP_TEST_PYTHON) + " has no torch (apt-get install python3-torch)";
      return f;
    }
    EXPECT_EQ(result.exit_code, 0) << result.out << result.err;
    for (const auto& line : result.out_lines()) {
      std::istringstream words(line);
      std::string tag, word;
      words >> tag;
      while (tag == "output" && words >> word) f.output.push_back(std::strtof(word.c_str(), nullptr));
      if (tag == "version") std::cout << "Python's torch: " << line.substr(8) << "\n";
    }
    return f;
  }();
  return files;
}

#define SKIP_WITHOUT_PYTHON_TORCH()                                 \
  if (!python_files().skip.empty()) GTEST_SKIP() << python_files().skip

// The C++ twin of the Python network: the same layers under the same names (0, 1, 2).
torch::nn::Sequential cpp_net(int64_t hidden = 8) {
  return torch::nn::Sequential(torch::nn::Linear(4, hidden), torch::nn::ReLU(), torch::nn::Linear(hidden, 3));
}

// The largest difference between the C++ network's output on Python's input and Python's output.
double max_output_difference(torch::nn::Sequential& net, const std::vector<float>& python) {
  torch::NoGradGuard no_grad;
  const auto y = net->forward(torch::linspace(-2, 2, 20).reshape({5, 4}));
  EXPECT_EQ(y.numel(), static_cast<int64_t>(python.size()));
  return (y.flatten() - torch::tensor(python)).abs().max().item<double>();
}

std::string load_error(const std::string& path) {
  try {
    CheckpointIO().load(path);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(no UsageError)";
}

TEST(TorchFile, PythonsStateDictLoadsAndTheModelComputesPythonsOutput) {
  SKIP_WITHOUT_PYTHON_TORCH();
  const auto& files = python_files();
  const Checkpoint state = CheckpointIO().load(files / "state_dict.pt");
  std::vector<std::string> keys;
  for (const auto& entry : state) keys.push_back(entry.key().toStringRef());
  EXPECT_EQ(keys, (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"}));  // Python's order
  auto net = cpp_net();
  load_state_dict(*net, state);
  const double difference = max_output_difference(net, files.output);
  std::cout << "max |C++ output - Python output| = " << difference << "\n";
  EXPECT_LE(difference, 1e-6);
}

TEST(TorchFile, NestedDictsOfTensorsAndNumbersLoadWithTheirValues) {
  SKIP_WITHOUT_PYTHON_TORCH();
  const Checkpoint file = CheckpointIO().load(python_files() / "nested.pt");
  const auto model = file.at("model").toGenericDict();
  EXPECT_EQ(model.size(), 4u);
  EXPECT_FALSE(model.contains("_metadata")) << "the OrderedDict's attributes are dropped, not made keys";
  EXPECT_EQ(model.at("0.weight").toTensor().sizes(), torch::IntArrayRef({8, 4}));
  EXPECT_EQ(file.at("epoch").toInt(), 3);
  EXPECT_EQ(file.at("lr").toDouble(), 0.25);
  EXPECT_EQ(file.at("big").toInt(), int64_t{1} << 40);
  EXPECT_EQ(file.at("negative").toInt(), -(int64_t{1} << 40) - 1);
  EXPECT_EQ(file.at("name").toStringRef(), "mlp");
  const c10::IValue flag_list = file.at("flags");
  const auto flags = flag_list.toListRef();
  ASSERT_EQ(flags.size(), 2u);
  EXPECT_TRUE(flags[0].toBool());
  EXPECT_TRUE(flags[1].isNone());
  EXPECT_TRUE(file.at("one").toGenericDict().at("t").toTensor().equal(torch::arange(3)));
  const auto deep = file.at("deep").toGenericDict().at("a").toGenericDict().at("b").toGenericDict().at("c").toTensor();
  EXPECT_TRUE(deep.equal(torch::eye(2, torch::kFloat64)));
  const c10::IValue pair = file.at("pair");
  EXPECT_EQ(pair.toTupleRef().elements().at(1).toStringRef(), "x");
  EXPECT_TRUE(file.at("view").toTensor().equal(torch::tensor({2.f, 4.f, 6.f})));
  EXPECT_TRUE(file.at("tied_a").toTensor().is_same(file.at("tied_b").toTensor())) << "one tensor saved twice is one";
}

TEST(TorchFile, AWholePickledModuleIsRefusedNamingItsClassAndTheFix) {
  SKIP_WITHOUT_PYTHON_TORCH();
  const std::string path = python_files() / "module.pt";
  const std::string message = load_error(path);
  EXPECT_NE(message.find("'" + path + "'"), std::string::npos) << message;
  EXPECT_NE(message.find("torch.nn.modules.container.Sequential"), std::string::npos) << message;
  EXPECT_NE(message.find("torch.save(model.state_dict(), path)"), std::string::npos) << message;
  EXPECT_EQ(message.find("INTERNAL ASSERT"), std::string::npos) << message;
}

TEST(TorchFile, AParameterAnotherClassAndAnotherProtocolAreRefusedWithTheFix) {
  SKIP_WITHOUT_PYTHON_TORCH();
  const std::map<std::string, std::vector<std::string>> expected = {
      {"parameter.pt", {"nn.Parameter", "p.detach()"}},
      {"set.pt", {"__builtin__.set", "torch.save(model.state_dict(), path)"}},
      {"protocol4.pt", {"pickle protocol 4", "without pickle_protocol"}},
  };
  for (const auto& [name, parts] : expected) {
    const std::string message = load_error(python_files() / name);
    for (const auto& part : parts) EXPECT_NE(message.find(part), std::string::npos) << name << ": " << message;
  }
}

TEST(TorchFile, PrefixedNamesAreListedWithTheRuleThatMapsThemAndLoadWithIt) {
  SKIP_WITHOUT_PYTHON_TORCH();
  const Checkpoint state = CheckpointIO().load(python_files() / "prefixed.pt");
  auto net = cpp_net();
  try {
    load_state_dict(*net, state);
    ADD_FAILURE() << "names with a prefix loaded without a KeyMap";
  } catch (const UsageError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("missing keys: 0.weight, 0.bias, 2.weight, 2.bias"), std::string::npos) << message;
    EXPECT_NE(message.find("unexpected keys: model.0.weight, model.0.bias"), std::string::npos) << message;
    EXPECT_NE(message.find("KeyMap().rename_prefix(\"model.\", \"\")"), std::string::npos) << message;
    EXPECT_NE(message.find("--init-weights-rename 'model.='"), std::string::npos) << message;
  }
  load_state_dict(*net, KeyMap().rename_prefix("model.", "").apply(state));
  EXPECT_LE(max_output_difference(net, python_files().output), 1e-6);
}

TEST(TorchFile, ShapeDifferencesAreListedInOneMessage) {
  SKIP_WITHOUT_PYTHON_TORCH();
  auto wider = cpp_net(9);
  try {
    load_state_dict(*wider, CheckpointIO().load(python_files() / "state_dict.pt"));
    ADD_FAILURE() << "a Linear(4, 9) took a Linear(4, 8)'s weights";
  } catch (const UsageError& e) {
    const std::string message = e.what();
    for (const char* part : {"size mismatch for 0.weight: the checkpoint has [8, 4], the model [9, 4]",
                             "size mismatch for 0.bias: the checkpoint has [8], the model [9]",
                             "size mismatch for 2.weight: the checkpoint has [3, 8], the model [3, 9]"}) {
      EXPECT_NE(message.find(part), std::string::npos) << message;
    }
  }
}

// Valid CRC32s around a pickle that lies about a tensor: refused before any tensor is read.
TEST(TorchFile, AStorageOrViewBeyondItsStoredBytesIsDamaged) {
  SKIP_WITHOUT_PYTHON_TORCH();
  const std::string storage = load_error(python_files() / "lying_storage.pt");
  EXPECT_NE(storage.find("is damaged: a tensor storage claims 1020 bytes and its record holds 128"), std::string::npos)
      << storage;
  // LibTorch 2.x checks a view against its storage itself, while it unpickles; 1.13 leaves it to us.
  // Either way the file is refused as damaged, naming the view that reaches past its storage.
  const std::string view = load_error(python_files() / "lying_view.pt");
  const bool ours = view.find("is damaged: a tensor's sizes and strides reach past its storage") != std::string::npos;
  const bool libtorchs = view.find("is damaged: LibTorch cannot read it") != std::string::npos &&
                         view.find("but storage only has 128 bytes") != std::string::npos;
  EXPECT_TRUE(ours || libtorchs) << view;
}

}  // namespace torch_file_test
}  // namespace checkpoint
}  // namespace lockstep
