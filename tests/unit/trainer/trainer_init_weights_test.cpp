// The Trainer's --init-weights (trainer/checkpointing.cpp): weights that Python's
// torch.save(model.state_dict(), path) wrote, loaded into the module before fit, through the
// flags of a real program (tests/programs/trainer_program) that trains no step and writes them.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include <torch/torch.h>

#include "../../support/command.h"
#include "../../support/paths.h"
#include "../../support/python_files.h"
#include "../../support/regression.h"
#include "../../support/temp_dir.h"
#include "../../support/written_parameters.h"

namespace lockstep {
namespace trainer_init_weights_test {

// The Python twin of testing::Regressor, saved plain, under a LightningModule-style `self.model`,
// and whole; its output on a fixed input as exact (hex) floats.
const char* const kPythonWriter = R"(
import sys, torch
d = sys.argv[1]
torch.manual_seed(1)
class Regressor(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 1)
    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))
class Lit(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model
net = Regressor()
torch.save(net.state_dict(), d + "/weights.pt")
torch.save(Lit(net).state_dict(), d + "/lit_weights.pt")
torch.save(net, d + "/module.pt")
with torch.no_grad():
    y = net(torch.linspace(-3, 3, 32).reshape(4, 8))
print(" ".join(float(v).hex() for v in y.flatten().tolist()))
)";

class TrainerInitWeights : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto files = testing::python_files(kPythonWriter, dir.path());
    if (!files.has_torch) GTEST_SKIP() << LOCKSTEP_TEST_PYTHON << " has no torch (apt-get install python3-torch)";
    ASSERT_EQ(files.command.exit_code, 0) << files.command.out << files.command.err;
    python_output = files.printed;
    ASSERT_EQ(python_output.size(), 4u) << files.command.out;
  }

  // trainer_program with `flags` and no training step; its exit code and streams.
  testing::CommandResult run(const std::vector<std::string>& flags, std::map<std::string, std::string> env = {}) {
    std::vector<std::string> argv{std::string(LOCKSTEP_BIN_DIR) + "/../tests/trainer_program", "--out", dir.path(),
                                  "--default-root-dir", dir / "runs", "--max-steps", "0", "--devices", "1",
                                  "--enable-progress-bar", "false", "--enable-checkpointing", "false"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    env.insert({{"PATH", "/usr/bin:/bin"}, {"LOCKSTEP_NO_BLAS_WARNING", "1"}, {"OMP_NUM_THREADS", "1"}});
    return testing::run_command(argv, env, std::chrono::seconds(60));
  }

  // The largest difference between Python's output and that of the weights the program wrote.
  double output_difference() {
    const auto ranks = testing::written_parameters(dir.path());
    EXPECT_EQ(ranks.size(), 1u);
    if (ranks.empty()) return INFINITY;
    testing::Regressor model;
    torch::NoGradGuard no_grad;
    auto params = model.parameters();  // fc1.weight, fc1.bias, fc2.weight, fc2.bias
    EXPECT_EQ(params.size(), ranks[0].size());
    for (size_t i = 0; i < params.size() && i < ranks[0].size(); ++i) params[i].copy_(ranks[0][i]);
    const auto y = model.forward(torch::linspace(-3, 3, 32).reshape({4, 8})).flatten();
    return (y - torch::tensor(python_output)).abs().max().item<double>();
  }

  testing::TempDir dir{"lockstep_init_weights"};
  std::vector<float> python_output;
};

TEST_F(TrainerInitWeights, PythonsStateDictSetsTheWeightsAndTheOutputsArePythons) {
  const auto result = run({"--init-weights", dir / "weights.pt"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const double difference = output_difference();
  std::cout << "max |C++ output - Python output| after --init-weights = " << difference << "\n";
  EXPECT_LE(difference, 1e-6);
}

TEST_F(TrainerInitWeights, APrefixIsMappedByTheRenameFlagOrItsVariableAndNamedWithout) {
  const auto refused = run({"--init-weights", dir / "lit_weights.pt"});
  EXPECT_EQ(refused.exit_code, 2) << refused.err;
  for (const char* part : {"--init-weights ", "missing keys: fc1.weight, fc1.bias, fc2.weight, fc2.bias",
                           "unexpected keys: model.fc1.weight", "--init-weights-rename 'model.='"}) {
    EXPECT_NE(refused.err.find(part), std::string::npos) << part << " not in: " << refused.err;
  }
  const auto mapped = run({}, {{"LOCKSTEP_TRAINER_INIT_WEIGHTS", dir / "lit_weights.pt"},
                               {"LOCKSTEP_TRAINER_INIT_WEIGHTS_RENAME", "model.="}});
  ASSERT_EQ(mapped.exit_code, 0) << mapped.err;
  EXPECT_LE(output_difference(), 1e-6);
}

TEST_F(TrainerInitWeights, AWholeModuleOrAMissingFileExitsTwoWithTheFix) {
  const auto module = run({"--init-weights", dir / "module.pt"});
  EXPECT_EQ(module.exit_code, 2) << module.err;
  EXPECT_NE(module.err.find("__main__.Regressor"), std::string::npos) << module.err;
  EXPECT_NE(module.err.find("torch.save(model.state_dict(), path)"), std::string::npos) << module.err;
  const auto missing = run({"--init-weights", dir / "nope.pt"});
  EXPECT_EQ(missing.exit_code, 2) << missing.err;
  EXPECT_NE(missing.err.find("--init-weights " + dir / "nope.pt" + ": no such file"), std::string::npos) << missing.err;
  for (const auto* result : {&module, &missing}) {
    EXPECT_EQ(result->err.find("terminate called"), std::string::npos) << result->err;
    EXPECT_EQ(result->err.find("INTERNAL ASSERT"), std::string::npos) << result->err;
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "params.0.pt")) << "trained anyway";
}

TEST_F(TrainerInitWeights, ResumingFromAStateDictPointsToInitWeights) {
  const auto result = run({"--ckpt-path", dir / "weights.pt"});
  EXPECT_EQ(result.exit_code, 2) << result.err;
  EXPECT_NE(result.err.find("use --init-weights " + dir / "weights.pt"), std::string::npos) << result.err;
}

}  // namespace trainer_init_weights_test
}  // namespace lockstep
