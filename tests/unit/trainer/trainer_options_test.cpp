// A Trainer built in code takes the LOCKSTEP_TRAINER_* variables for the fields it left at their
// defaults (Lightning 2.x's PL_TRAINER_*); options that came through the flags are not read again.
#include <lockstep/trainer/trainer_options.h>

#include <cstdlib>

#include <gtest/gtest.h>

#include <lockstep/core/error.h>
#include <lockstep/environments/cluster_environment.h>
#include <lockstep/trainer/trainer.h>
#include "../../support/errors.h"

namespace lockstep {
namespace {

TEST(TrainerVariables, TrainerFieldsTakeTheirVariablesUnlessSetInCode) {
  auto options = TrainerOptions().max_epochs(3);
  apply_trainer_variables(options, environments::Environ({{"LOCKSTEP_TRAINER_MAX_EPOCHS", "5"},
                                                          {"LOCKSTEP_TRAINER_LOG_EVERY_N_STEPS", "7"},
                                                          {"LOCKSTEP_TRAINER_LIMIT_TRAIN_BATCHES", "0.5"},
                                                          {"LOCKSTEP_TRAINER_DETERMINISTIC", "true"},
                                                          {"LOCKSTEP_TRAINER_GRADIENT_CLIP_ALGORITHM", "value"},
                                                          {"LOCKSTEP_TRAINER_PROFILER", "pytorch"},
                                                          {"LOCKSTEP_TRAINER_DEVICES", "2"}}));
  EXPECT_EQ(options.max_epochs(), 3) << "set in code: the code wins";
  EXPECT_EQ(options.log_every_n_steps(), 7);
  EXPECT_EQ(options.limit_train_batches(), BatchLimit(0.5));
  EXPECT_TRUE(options.deterministic());
  EXPECT_EQ(options.gradient_clip_algorithm(), "value");
  EXPECT_EQ(options.profiler(), "pytorch");
  EXPECT_EQ(options.devices(), "2") << "the plan's fields too";
  EXPECT_FALSE(options.trainer_variables());
}

TEST(TrainerVariables, ATrainerBuiltInCodeReadsTheProcessVariables) {
  ::setenv("LOCKSTEP_TRAINER_LOG_EVERY_N_STEPS", "7", 1);
  ::setenv("LOCKSTEP_TRAINER_MAX_EPOCHS", "5", 1);
  const Trainer trainer(TrainerOptions().max_epochs(2));
  ::unsetenv("LOCKSTEP_TRAINER_LOG_EVERY_N_STEPS");
  ::unsetenv("LOCKSTEP_TRAINER_MAX_EPOCHS");
  EXPECT_EQ(trainer.options().log_every_n_steps(), 7);
  EXPECT_EQ(trainer.options().max_epochs(), 2);
}

TEST(TrainerVariables, ABadTrainerValueIsAUsageErrorNamingTheVariable) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"LOCKSTEP_TRAINER_MAX_EPOCHS=-5", "LOCKSTEP_TRAINER_MAX_EPOCHS=-5 is outside -1..1099511627776"},
      {"LOCKSTEP_TRAINER_LIMIT_TRAIN_BATCHES=lots",
       "LOCKSTEP_TRAINER_LIMIT_TRAIN_BATCHES 'lots' is neither a fraction (0.25) nor a batch count (10)"},
      {"LOCKSTEP_TRAINER_GRADIENT_CLIP_ALGORITHM=norm2",
       "LOCKSTEP_TRAINER_GRADIENT_CLIP_ALGORITHM=norm2 is not known. Set it to norm or value, or unset it."},
      {"LOCKSTEP_TRAINER_ENABLE_PROGRESS_BAR=sometimes", "LOCKSTEP_TRAINER_ENABLE_PROGRESS_BAR=sometimes is not true or false"},
      {"LOCKSTEP_TRAINER_SEED=-2", "LOCKSTEP_TRAINER_SEED=-2 is outside -1.."},
      {"LOCKSTEP_TRAINER_PROFILER=advanced",
       "LOCKSTEP_TRAINER_PROFILER=advanced is not known. Set it to simple or pytorch or true or false, or unset it."},
  };
  for (const auto& [variable, expected] : cases) {
    const auto eq = variable.find('=');
    const std::map<std::string, std::string> vars{{variable.substr(0, eq), variable.substr(eq + 1)}};
    const environments::Environ environ(vars);
    auto options = TrainerOptions();
    const auto message = testing::error_of<UsageError>([&] { apply_trainer_variables(options, environ); });
    EXPECT_NE(message.find(expected), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace lockstep
