// The flags and their LOCKSTEP_TRAINER_* variables: which value wins (cli/trainer_flags.h), and
// what the help says.
#include <lockstep/cli/trainer_flags.h>

#include <cstdlib>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <lockstep/cli/guarded_main.h>
#include <lockstep/trainer/trainer.h>

namespace lockstep {
namespace trainer_flags_test {

int parse(CLI::App& app, std::vector<std::string> args) {
  args.insert(args.begin(), "prog");
  std::vector<char*> argv;
  for (auto& arg : args) argv.push_back(arg.data());
  return cli::parse_or_exit_code(app, static_cast<int>(argv.size()), argv.data());
}

}  // namespace trainer_flags_test

namespace {

using trainer_flags_test::parse;

// With the flags: the command line > the variable > the program's own default > the library's.
// The Trainer then does not read the variables again (a flag that gives the library's default
// would otherwise lose to its variable).
TEST(TrainerFlags, AFlagWinsOverItsVariableWhichWinsOverTheProgramsDefault) {
  ::setenv("LOCKSTEP_TRAINER_MAX_EPOCHS", "5", 1);
  ::setenv("LOCKSTEP_TRAINER_LOG_EVERY_N_STEPS", "7", 1);
  auto options = TrainerOptions().max_epochs(3).log_every_n_steps(9);
  CLI::App app("prog");
  cli::add_trainer_flags(app, options);
  const int code = parse(app, {"--max-epochs", "-1"});
  const Trainer trainer(options);
  ::unsetenv("LOCKSTEP_TRAINER_MAX_EPOCHS");
  ::unsetenv("LOCKSTEP_TRAINER_LOG_EVERY_N_STEPS");
  ASSERT_EQ(code, -1);
  EXPECT_EQ(options.max_epochs(), -1) << "the flag wins over its variable";
  EXPECT_EQ(options.log_every_n_steps(), 7) << "the variable wins over the program's default";
  EXPECT_FALSE(options.trainer_variables());
  EXPECT_EQ(trainer.options().max_epochs(), -1) << "the Trainer read the variable again";
}

// --fast-dev-run alone is 1 batch (Lightning's fast_dev_run=True), with a number that many; the
// Trainer then runs one epoch of them with no sanity check and no checkpointing.
TEST(TrainerFlags, FastDevRunAloneIsOneBatchAndWithANumberThatMany) {
  for (const auto& [args, batches] : std::vector<std::pair<std::vector<std::string>, int64_t>>{
           {{"--fast-dev-run"}, 1}, {{"--fast-dev-run", "3", "--max-epochs", "9"}, 3}, {{}, 0}}) {
    auto options = TrainerOptions();
    CLI::App app("prog");
    cli::add_trainer_flags(app, options);
    ASSERT_EQ(parse(app, args), -1);
    EXPECT_EQ(options.fast_dev_run(), batches);
    const Trainer trainer(options);
    if (batches == 0) continue;
    EXPECT_EQ(trainer.options().max_epochs(), 1);
    EXPECT_EQ(trainer.options().max_steps(), batches);
    EXPECT_EQ(trainer.options().limit_val_batches(), BatchLimit(batches));
    EXPECT_EQ(trainer.options().num_sanity_val_steps(), 0);
    EXPECT_FALSE(trainer.options().enable_checkpointing());
  }
}

// A Trainer built in code stops a program on a bad variable as a bad flag does: exit code 2 and
// one line naming the variable.
TEST(TrainerFlags, ABadVariableOfATrainerBuiltInCodeExitsTwoNamingIt) {
  ::setenv("LOCKSTEP_TRAINER_MAX_EPOCHS", "lots", 1);
  ::testing::internal::CaptureStderr();
  const int code = cli::guarded_main("prog", [] {
    Trainer trainer(TrainerOptions().devices("1"));
    return 0;
  });
  const std::string err = ::testing::internal::GetCapturedStderr();
  ::unsetenv("LOCKSTEP_TRAINER_MAX_EPOCHS");
  EXPECT_EQ(code, 2) << err;
  EXPECT_NE(err.find("prog: error: LOCKSTEP_TRAINER_MAX_EPOCHS=lots is not a whole number"), std::string::npos) << err;
}

// --help names the backends this build can create, and says mpi is not one, as the refusal does.
TEST(TrainerFlags, TheBackendHelpListsWhatThisBuildCreatesAndNoMpi) {
  TrainerOptions options;
  CLI::App app("prog");
  cli::add_trainer_flags(app, options);
  const std::string help = app.help("", CLI::AppFormatMode::All);
  const auto at = help.find("--process-group-backend");
  ASSERT_NE(at, std::string::npos) << help;
  const std::string line = help.substr(at, help.find("--timeout", at) - at);  // its name and description
#ifdef USE_C10D_NCCL
  EXPECT_NE(line.find("gloo|nccl (what this build can create; no mpi)"), std::string::npos) << line;
#else
  EXPECT_NE(line.find("gloo (what this build can create; no mpi)"), std::string::npos) << line;
#endif
}

}  // namespace
}  // namespace lockstep
