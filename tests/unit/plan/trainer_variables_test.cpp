// LOCKSTEP_TRAINER_* variables as defaults of options built in code (Lightning 2.x's PL_TRAINER_*):
// they fill the fields still at their defaults, a value set in code wins, and a bad value is a
// UsageError naming the variable.
#include <lockstep/plan/trainer_variables.h>

#include <gtest/gtest.h>

#include <lockstep/core/error.h>
#include <lockstep/environments/cluster_environment.h>
#include <lockstep/fabric/fabric_options.h>
#include "../../support/errors.h"

namespace lockstep {
namespace {

TEST(TrainerVariables, TheyFillTheFieldsStillAtTheirDefaultsAndCodeWins) {
  const environments::Environ environ({{"LOCKSTEP_TRAINER_DEVICES", "2"},
                                       {"LOCKSTEP_TRAINER_PRECISION", "64-true"},
                                       {"LOCKSTEP_TRAINER_SYNC_BATCHNORM", "true"},
                                       {"LOCKSTEP_TRAINER_TIMEOUT", "60"},
                                       {"LOCKSTEP_TRAINER_MAX_RESTARTS", "3"},
                                       {"LOCKSTEP_TRAINER_STRATEGY", "ddp_fork"}});
  auto options = FabricOptions().strategy("ddp").timeout(30);
  apply_trainer_variables(options, environ);
  EXPECT_EQ(options.devices(), "2");
  EXPECT_EQ(options.precision(), "64-true");
  EXPECT_TRUE(options.sync_batchnorm());
  EXPECT_EQ(options.max_restarts(), 3);
  EXPECT_EQ(options.strategy(), "ddp") << "set in code: the code wins";
  EXPECT_EQ(options.timeout(), 30.0) << "set in code: the code wins";
  EXPECT_EQ(options.accelerator(), "auto") << "no variable: the default stays";
  EXPECT_FALSE(options.trainer_variables()) << "read once";

  auto again = FabricOptions().trainer_variables(false);  // as cli::add_plan_flags leaves them
  apply_trainer_variables(again, environ);
  EXPECT_EQ(again.devices(), "auto");
}

TEST(TrainerVariables, ABadValueIsAUsageErrorNamingTheVariable) {
  const std::vector<std::pair<std::map<std::string, std::string>, std::string>> cases = {
      {{{"LOCKSTEP_TRAINER_NUM_NODES", "two"}}, "LOCKSTEP_TRAINER_NUM_NODES=two is not a whole number. Set it to one "
                                                "in 1..1048576, or unset it."},
      {{{"LOCKSTEP_TRAINER_NUM_NODES", "0"}}, "LOCKSTEP_TRAINER_NUM_NODES=0 is outside 1..1048576."},
      {{{"LOCKSTEP_TRAINER_TIMEOUT", "-1"}}, "LOCKSTEP_TRAINER_TIMEOUT=-1 is outside"},
      {{{"LOCKSTEP_TRAINER_TIMEOUT", "soon"}}, "LOCKSTEP_TRAINER_TIMEOUT=soon is not a number"},
      {{{"LOCKSTEP_TRAINER_SYNC_BATCHNORM", "maybe"}}, "LOCKSTEP_TRAINER_SYNC_BATCHNORM=maybe is not true or false"},
      {{{"LOCKSTEP_TRAINER_MAX_RESTARTS", "-1"}}, "LOCKSTEP_TRAINER_MAX_RESTARTS=-1 is outside 0..1048576"},
  };
  for (const auto& [vars, expected] : cases) {
    auto options = FabricOptions();
    const environments::Environ env(vars);
    const auto message = testing::error_of<UsageError>([&] { apply_trainer_variables(options, env); });
    EXPECT_NE(message.find(expected), std::string::npos) << message;
  }
}

// The --fsdp-* flags' variables reach FSDP through the flags only; options built in code would
// ignore them, so they are refused by name.
TEST(TrainerVariables, AnFsdpVariableWithoutTheFlagsIsRefusedByName) {
  auto options = FabricOptions().strategy("fsdp");
  const environments::Environ env({{"LOCKSTEP_TRAINER_FSDP_SHARDING", "SHARD_GRAD_OP"}});
  const auto message = testing::error_of<UsageError>([&] { apply_trainer_variables(options, env); });
  EXPECT_NE(message.find("LOCKSTEP_TRAINER_FSDP_SHARDING=SHARD_GRAD_OP is read by the --fsdp-* flags"),
            std::string::npos)
      << message;

  auto flags = FabricOptions().trainer_variables(false);  // as cli::add_plan_flags leaves them
  EXPECT_NO_THROW(apply_trainer_variables(flags, env));
}

}  // namespace
}  // namespace lockstep
