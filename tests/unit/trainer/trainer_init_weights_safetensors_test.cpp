// The Trainer's --init-weights with a safetensors file (checkpoint/safetensors.h), through the
// flags of a real program (tests/programs/trainer_program) that trains no step and writes the
// weights it starts from; the same rename flag and refusals as a torch.save file.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <torch/torch.h>

#include <lockstep/checkpoint/safetensors.h>
#include <lockstep/checkpoint/state_dict.h>

#include "../../support/command.h"
#include "../../support/paths.h"
#include "../../support/regression.h"
#include "../../support/temp_dir.h"
#include "../../support/written_parameters.h"

namespace lockstep {
namespace trainer_init_weights_safetensors_test {

class TrainerInitWeightsSafetensors : public ::testing::Test {
 protected:
  // trainer_program with `flags` and no training step; its exit code and streams.
  testing::CommandResult run(const std::vector<std::string>& flags) {
    std::vector<std::string> argv{std::string(LOCKSTEP_BIN_DIR) + "/../tests/trainer_program", "--out", dir.path(),
                                  "--default-root-dir", dir / "runs", "--max-steps", "0", "--devices", "1",
                                  "--enable-progress-bar", "false", "--enable-checkpointing", "false"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    return testing::run_command(argv, {{"PATH", "/usr/bin:/bin"}, {"LOCKSTEP_NO_BLAS_WARNING", "1"}, {"OMP_NUM_THREADS", "1"}},
                                std::chrono::seconds(60));
  }

  testing::TempDir dir{"lockstep_init_safetensors"};
};

TEST_F(TrainerInitWeightsSafetensors, APrefixedFileSetsTheWeightsWithTheRenameFlag) {
  torch::manual_seed(11);
  testing::Regressor source;
  c10::Dict<std::string, torch::Tensor> prefixed;
  for (const auto& item : checkpoint::state_dict(source)) prefixed.insert("model." + item.key(), item.value());
  checkpoint::save_safetensors(prefixed, dir / "lit.safetensors");
  const auto refused = run({"--init-weights", dir / "lit.safetensors"});
  EXPECT_EQ(refused.exit_code, 2) << refused.err;
  EXPECT_NE(refused.err.find("--init-weights-rename 'model.='"), std::string::npos) << refused.err;
  const auto result = run({"--init-weights", dir / "lit.safetensors", "--init-weights-rename", "model.="});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const auto ranks = testing::written_parameters(dir.path());
  ASSERT_EQ(ranks.size(), 1u);
  const auto expected = source.parameters();  // fc1.weight, fc1.bias, fc2.weight, fc2.bias
  ASSERT_EQ(ranks[0].size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_TRUE(torch::equal(ranks[0][i], expected[i])) << i;
}

TEST_F(TrainerInitWeightsSafetensors, ADamagedFileExitsTwoNamingTheProblem) {
  std::ofstream(dir / "cut.safetensors", std::ios::binary) << std::string("\x40\0\0\0\0\0\0\0{\"a\"", 12);
  const auto result = run({"--init-weights", dir / "cut.safetensors"});
  EXPECT_EQ(result.exit_code, 2) << result.err;
  EXPECT_NE(result.err.find("--init-weights " + dir / "cut.safetensors" + ": safetensors file"), std::string::npos)
      << result.err;
  EXPECT_NE(result.err.find("truncated: its header length is 64 bytes and only 4 follow"), std::string::npos) << result.err;
  EXPECT_FALSE(std::filesystem::exists(dir / "params.0.pt")) << "trained anyway";
}

}  // namespace trainer_init_weights_safetensors_test
}  // namespace lockstep
