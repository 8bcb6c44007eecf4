// --config FILE.yaml and --print-config (cli/yaml_config.h): the sections, which value wins, the
// refusals, and a run repeated from the config.yaml it wrote.
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <lockstep/cli/trainer_flags.h>
#include <lockstep/core/program_config.h>

#include "../../support/command.h"
#include "../../support/paths.h"
#include "../../support/temp_dir.h"

namespace lockstep {
namespace yaml_config_test {

// A program's flags: the Trainer's and two of its own.
struct Program {
  Program() {
    cli::add_trainer_flags(app, options);
    app.add_option("--lr", lr, "learning rate")->capture_default_str();
    app.add_flag("--no-shuffle", no_shuffle, "keep the order");
  }
  int parse(std::vector<std::string> args) {
    args.insert(args.begin(), "prog");
    std::vector<char*> argv;
    for (auto& arg : args) argv.push_back(arg.data());
    return cli::parse_or_exit_code(app, static_cast<int>(argv.size()), argv.data());
  }
  CLI::App app{"prog"};
  TrainerOptions options;
  double lr = 1e-3;
  bool no_shuffle = false;
};

std::string write(const testing::TempDir& dir, const std::string& name, const std::string& text) {
  const std::string path = dir.path() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

}  // namespace yaml_config_test

namespace {

using yaml_config_test::Program;
using yaml_config_test::write;

TEST(YamlConfig, TheTrainerSectionSetsTrainerFlagsAndTheModelSectionTheProgramsOwn) {
  testing::TempDir dir("lockstep_config");
  const auto file = write(dir, "c.yaml",
                          "trainer:\n  max_epochs: 4\n  limit-train-batches: 0.25\n  enable_progress_bar: false\n"
                          "  ckpt_path: ''\n  fsdp_sharding: null\nmodel:\n  lr: 0.05\n  no_shuffle: true\n");
  Program p;
  ASSERT_EQ(p.parse({"--config", file}), -1);
  EXPECT_EQ(p.options.max_epochs(), 4);
  EXPECT_EQ(p.options.limit_train_batches(), BatchLimit(0.25));
  EXPECT_FALSE(p.options.enable_progress_bar());
  EXPECT_EQ(p.options.ckpt_path(), "");
  EXPECT_EQ(p.lr, 0.05);
  EXPECT_TRUE(p.no_shuffle);
}

// CLI11's order: the command line (before or after --config) > the file > LOCKSTEP_TRAINER_* >
// the program's defaults.
TEST(YamlConfig, TheCommandLineWinsWhereverItStandsAndTheFileWinsOverAVariable) {
  testing::TempDir dir("lockstep_config");
  const auto file = write(dir, "c.yaml", "trainer:\n  max_epochs: 4\n  max_steps: 40\nmodel:\n  lr: 0.05\n");
  ::setenv("LOCKSTEP_TRAINER_MAX_STEPS", "7", 1);
  ::setenv("LOCKSTEP_TRAINER_LOG_EVERY_N_STEPS", "9", 1);
  Program before, after;
  const int before_code = before.parse({"--max-epochs", "2", "--config", file});
  const int after_code = after.parse({"--config", file, "--lr", "0.5", "--max-epochs", "3"});
  ::unsetenv("LOCKSTEP_TRAINER_MAX_STEPS");
  ::unsetenv("LOCKSTEP_TRAINER_LOG_EVERY_N_STEPS");
  ASSERT_EQ(before_code, -1);
  ASSERT_EQ(after_code, -1);
  EXPECT_EQ(before.options.max_epochs(), 2) << "a flag before --config";
  EXPECT_EQ(after.options.max_epochs(), 3) << "a flag after --config";
  EXPECT_EQ(before.lr, 0.05);
  EXPECT_EQ(after.lr, 0.5);
  EXPECT_EQ(after.options.max_steps(), 40) << "the file wins over LOCKSTEP_TRAINER_MAX_STEPS";
  EXPECT_EQ(after.options.log_every_n_steps(), 9) << "the variable still sets what the file does not";
}

TEST(YamlConfig, AnUnknownOrMisplacedKeyExitsTwoNamingTheKeyTheFileAndTheFix) {
  testing::TempDir dir("lockstep_config");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"trainer:\n  max_epoch: 3\n", "unknown key trainer.max_epoch. Did you mean trainer.max_epochs?"},
      {"model:\n  max_epochs: 3\n", "model.max_epochs is a flag of trainer:. Move it under trainer:."},
      {"trainer:\n  lr: 0.1\n", "trainer.lr is a flag of model:. Move it under model:."},
      {"data:\n  batch_size: 3\n", "unknown key data. The program's data flags"},
      {"seed_everything: 3\n", "unknown key seed_everything. Put the seed under trainer: as seed: N"},
      {"trainer:\n  max_epochs: {a: 1}\n", "trainer.max_epochs holds a mapping, where a flag takes a value"},
      {"trainer: [1, 2\n", "not YAML (line 2"},
      {"- 1\n", "it is not a mapping. A config has two sections: trainer:"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto file = write(dir, "bad" + std::to_string(i) + ".yaml", cases[i].first);
    Program p;
    ::testing::internal::CaptureStderr();
    const int code = p.parse({"--config", file});
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(code, 2) << "case " << i;
    EXPECT_NE(err.find("prog: error: --config " + file + ": " + cases[i].second), std::string::npos)
        << "case " << i << ": " << err;
  }
  Program missing;
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(missing.parse({"--config", dir.path() + "/none.yaml"}), 2);
  EXPECT_NE(::testing::internal::GetCapturedStderr().find("none.yaml"), std::string::npos);
  Program retired;  // a retired flag in a file is refused as on the command line, with what replaced it
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(retired.parse({"--config", write(dir, "gpus.yaml", "trainer:\n  gpus: 2\n")}), 2);
  EXPECT_NE(::testing::internal::GetCapturedStderr().find("--gpus: Lightning 1.7 replaced it"), std::string::npos);
}

// What --print-config writes, --config reads back to the same options, bit for bit, and prints
// again unchanged.
TEST(YamlConfig, PrintConfigWritesTheResolvedFlagsWhichConfigReadsBackExactly) {
  testing::TempDir dir("lockstep_config");
  Program first;
  ::testing::internal::CaptureStdout();
  const int code = first.parse({"--max-epochs", "5", "--lr", "0.1234567891234567", "--gradient-clip-val", "0.3",
                                "--limit-val-batches", "10", "--no-shuffle", "--enable-checkpointing", "false",
                                "--print-config"});
  const std::string printed = ::testing::internal::GetCapturedStdout();
  ASSERT_EQ(code, 0) << "--print-config exits 0";
  EXPECT_EQ(printed, program_config());
  for (const char* line : {"trainer:\n", "  max_epochs: 5\n", "  gradient_clip_val: 0.3\n", "  limit_val_batches: 10\n",
                           "  enable_checkpointing: false\n", "  timeout: 1800.0\n", "  fsdp_sharding: ~\n", "model:\n",
                           "  lr: 0.1234567891234567\n", "  no_shuffle: true\n"}) {
    EXPECT_NE(printed.find(line), std::string::npos) << line << " missing from\n" << printed;
  }
  EXPECT_EQ(printed.find("help"), std::string::npos) << printed;
  Program second;
  ASSERT_EQ(second.parse({"--config", write(dir, "printed.yaml", printed)}), -1);
  EXPECT_EQ(second.options.max_epochs(), 5);
  EXPECT_EQ(second.options.gradient_clip_val(), 0.3);
  EXPECT_EQ(second.options.limit_val_batches(), BatchLimit(int64_t{10}));
  EXPECT_FALSE(second.options.enable_checkpointing());
  EXPECT_EQ(second.lr, first.lr) << "the printed value reads back to the same double";
  EXPECT_TRUE(second.no_shuffle);
  Program third;
  ::testing::internal::CaptureStdout();
  ASSERT_EQ(third.parse({"--config", dir.path() + "/printed.yaml", "--print-config"}), 0);
  EXPECT_EQ(::testing::internal::GetCapturedStdout(), printed);
}

// A run writes config.yaml beside hparams.yaml; --config with it repeats the run: the same
// resolved flags and the same weights, bit for bit. Two ranks, so the launched worker reads the
// file too.
TEST(YamlConfig, ARunRepeatedFromItsConfigYamlEndsWithTheSameWeights) {
  testing::TempDir dir("lockstep_config");
  const std::string program = std::string(LOCKSTEP_BIN_DIR) + "/../tests/trainer_program";
  const std::map<std::string, std::string> env{{"PATH", "/usr/bin:/bin"}, {"LOCKSTEP_NO_BLAS_WARNING", "1"}};
  const std::string a = dir.path() + "/a", b = dir.path() + "/b";
  std::filesystem::create_directories(a);
  std::filesystem::create_directories(b);
  const auto original = testing::run_command({program, "--out", a, "--default-root-dir", a, "--max-epochs", "2",
                                              "--batch-size", "4", "--adam", "--seed", "5", "--devices", "2",
                                              "--strategy", "ddp", "--accumulate-grad-batches", "2"},
                                             env, std::chrono::seconds(60));
  ASSERT_EQ(original.exit_code, 0) << original.err;
  const std::string config = a + "/lockstep_logs/version_0/config.yaml";
  ASSERT_TRUE(std::filesystem::exists(config)) << original.err;
  const std::string saved = testing::slurp(config);
  EXPECT_NE(saved.find("  accumulate_grad_batches: 2\n"), std::string::npos) << saved;
  EXPECT_NE(saved.find("  adam: true\n"), std::string::npos) << saved;
  const auto printed = testing::run_command({program, "--config", config, "--print-config"}, env, std::chrono::seconds(60));
  ASSERT_EQ(printed.exit_code, 0) << printed.err;
  EXPECT_EQ(printed.out, saved) << "the same resolved config";
  const auto repeated = testing::run_command({program, "--config", config, "--out", b, "--default-root-dir", b}, env,
                                             std::chrono::seconds(60));
  ASSERT_EQ(repeated.exit_code, 0) << repeated.err;
  for (const char* rank : {"0", "1"}) {
    std::vector<torch::Tensor> first, second;
    torch::load(first, a + "/params." + rank + ".pt");
    torch::load(second, b + "/params." + rank + ".pt");
    ASSERT_EQ(first.size(), second.size());
    for (size_t i = 0; i < first.size(); ++i) {
      EXPECT_TRUE(torch::equal(first[i], second[i])) << "rank " << rank << " parameter " << i;
    }
  }
  EXPECT_EQ(testing::slurp(a + "/done.0"), testing::slurp(b + "/done.0")) << "the same number of steps";
}

}  // namespace
}  // namespace lockstep
