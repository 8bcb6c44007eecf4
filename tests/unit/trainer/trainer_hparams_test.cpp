// The module's typed hparams() through a run: hparams.yaml, the checkpoint's hyper_parameters
// read back typed, and the note of a resume whose module has other ones. And config.yaml: the
// program's resolved flags, written beside hparams.yaml only when there are some.
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <lockstep/checkpoint/checkpoint_io.h>
#include <lockstep/checkpoint/hyper_parameters.h>
#include <lockstep/core/program_config.h>
#include <lockstep/trainer/trainer.h>

#include "../../support/command.h"
#include "../../support/trainer_runs.h"

namespace lockstep {
namespace trainer_hparams_test {

struct WithHparams : testing::Regressor {
  explicit WithHparams(double lr) {
    hparams() = {{"lr", lr}, {"layers", {16, 1}}, {"adam", false}, {"optim", {{"name", "sgd"}, {"momentum", 0.0}}}};
  }
};

}  // namespace trainer_hparams_test

namespace {

using trainer_hparams_test::WithHparams;

TEST(TrainerHparams, TheyAreWrittenTypedAndAResumeWithOtherOnesSaysWhich) {
  testing::TempDir dir("lockstep_hparams");
  auto data = testing::loader_of(testing::regression_data(32), 16);
  const auto options = testing::quiet_options(dir).max_epochs(1).enable_checkpointing(true);
  Trainer first(options);
  first.fit(std::make_shared<WithHparams>(0.05), data);
  // Keys sorted and lists at their key's indent, as PyYAML's dump (Lightning's hparams.yaml) lays them out.
  EXPECT_EQ(testing::slurp(first.log_dir() + "/hparams.yaml"),
            "adam: false\nlayers:\n- 16\n- 1\nlr: 0.05\noptim:\n  momentum: 0.0\n  name: sgd\n");
  EXPECT_FALSE(std::filesystem::exists(first.log_dir() + "/config.yaml")) << "no flags were parsed: no config";
  const std::string ckpt = first.log_dir() + "/checkpoints/last.ckpt";
  const auto saved = checkpoint::hparams_of(checkpoint::CheckpointIO().load(ckpt));
  EXPECT_EQ(saved, WithHparams(0.05).hparams());
  EXPECT_TRUE(saved.at("lr").is_number_float());

  ::testing::internal::CaptureStderr();
  Trainer same(testing::quiet_options(dir).max_epochs(2).ckpt_path(ckpt));
  same.fit(std::make_shared<WithHparams>(0.05), data);
  EXPECT_EQ(::testing::internal::GetCapturedStderr().find("hparams differ"), std::string::npos);

  ::testing::internal::CaptureStderr();
  Trainer other(testing::quiet_options(dir).max_epochs(2).ckpt_path(ckpt));
  other.fit(std::make_shared<WithHparams>(0.5), data);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("lockstep: the module's hparams differ from those saved in " + ckpt +
                     ": lr 0.05 -> 0.5; the run goes on with the module's"),
            std::string::npos)
      << err;
  EXPECT_NE(testing::slurp(other.log_dir() + "/hparams.yaml").find("lr: 0.5\n"), std::string::npos);
}

TEST(TrainerHparams, TheProgramsConfigIsWrittenBesideThemOnRankZero) {
  testing::TempDir dir("lockstep_hparams");
  set_program_config("trainer:\n  max_epochs: 1\n");
  Trainer trainer(testing::quiet_options(dir).max_epochs(1));
  trainer.fit(std::make_shared<WithHparams>(0.05), testing::loader_of(testing::regression_data(16), 16));
  set_program_config("");
  EXPECT_EQ(testing::slurp(trainer.log_dir() + "/config.yaml"), "trainer:\n  max_epochs: 1\n");
}

}  // namespace
}  // namespace lockstep
