// Trainer flags that Lightning dropped (log_gpu_memory, resume_from_checkpoint, ...): each is
// refused, as flag or as LOCKSTEP_TRAINER_ variable, with exit code 2 and what replaced it, and
// --help does not list them.
#include <lockstep/cli/trainer_flags.h>

#include <stdlib.h>

#include <cctype>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace lockstep {
namespace retired_flags_test {
namespace {

struct Parsed {
  int code;
  std::string err;
};

// Parses `args` with the Trainer's flags (or Fabric's).
Parsed parse(std::vector<std::string> args, bool fabric = false) {
  TrainerOptions trainer_options;
  FabricOptions fabric_options;
  int64_t seed = -1;
  CLI::App app{"retired flags", "prog"};
  if (fabric) {
    cli::add_fabric_flags(app, fabric_options, seed);
  } else {
    cli::add_trainer_flags(app, trainer_options);
  }
  args.insert(args.begin(), "prog");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  ::testing::internal::CaptureStderr();
  const int code = cli::parse_or_exit_code(app, static_cast<int>(argv.size()), argv.data());
  return {code, ::testing::internal::GetCapturedStderr()};
}

struct Retired {
  std::string flag;
  std::string fix;  // part of the message
};

const std::vector<Retired> retired = {
    {"--gpus", "use --accelerator cuda --devices N"},
    {"--tpu-cores", "use --accelerator cpu or cuda with --devices N"},
    {"--ipus", "use --accelerator cpu or cuda with --devices N"},
    {"--num-processes", "use --accelerator cpu --devices N --strategy ddp"},
    {"--distributed-backend", "use --strategy ddp"},
    {"--amp-backend", "use --precision bf16-mixed or 16-mixed"},
    {"--amp-level", "use --precision bf16-mixed or 16-mixed"},
    {"--replace-sampler-ddp", "use --use-distributed-sampler true|false"},
    {"--resume-from-checkpoint", "use --ckpt-path PATH"},
    {"--checkpoint-callback", "use --enable-checkpointing true|false"},
    {"--weights-save-path", "use --default-root-dir DIR"},
    {"--log-gpu-memory", "remove the flag and watch nvidia-smi"},
    {"--progress-bar-refresh-rate", "use --enable-progress-bar true|false"},
    {"--flush-logs-every-n-steps", "every --log-every-n-steps steps"},
    {"--terminate-on-nan", "--detect-anomaly true names the operation"},
    {"--weights-summary", "Lightning 1.7 replaced it: use --enable-model-summary true|false"},
    {"--track-grad-norm", "on_before_optimizer_step"},
    {"--auto-lr-find", "use --lr-find"},
    {"--auto-scale-batch-size", "use --scale-batch-size power|binsearch"},
};

// "--log-gpu-memory" -> "LOCKSTEP_TRAINER_LOG_GPU_MEMORY"
std::string variable_of(const std::string& flag) {
  std::string name = "LOCKSTEP_TRAINER_";
  for (char c : flag.substr(2)) name += c == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return name;
}

TEST(RetiredFlags, EachIsRefusedWithWhatReplacedIt) {
  for (const auto& r : retired) {
    const auto parsed = parse({r.flag, "1"});
    EXPECT_EQ(parsed.code, 2) << r.flag << ": " << parsed.err;
    EXPECT_NE(parsed.err.find("prog: error: " + r.flag + ": "), std::string::npos) << parsed.err;
    EXPECT_NE(parsed.err.find(r.fix), std::string::npos) << r.flag << " should name '" << r.fix << "': " << parsed.err;
  }
}

TEST(RetiredFlags, TheirVariablesAreRefusedToo) {
  for (const auto& r : retired) {
    const std::string variable = variable_of(r.flag);
    ::setenv(variable.c_str(), "1", 1);
    const auto parsed = parse({});
    ::unsetenv(variable.c_str());
    EXPECT_EQ(parsed.code, 2) << variable << ": " << parsed.err;
    EXPECT_NE(parsed.err.find(r.fix), std::string::npos) << variable << " should name '" << r.fix << "': " << parsed.err;
  }
}

TEST(RetiredFlags, HelpDoesNotListThem) {
  TrainerOptions options;
  CLI::App app{"retired flags", "prog"};
  cli::add_trainer_flags(app, options);
  const std::string help = app.help();
  ASSERT_NE(help.find("--max-epochs"), std::string::npos) << help;
  for (const auto& r : retired) EXPECT_EQ(help.find(r.flag + " "), std::string::npos) << r.flag << " is listed:\n" << help;
}

// Fabric never had the Trainer's loop flags: there they are unknown; the device flags are retired.
TEST(RetiredFlags, FabricRefusesTheDeviceFlagsAndDoesNotKnowTheTrainersOwn) {
  auto parsed = parse({"--gpus", "2"}, /*fabric=*/true);
  EXPECT_EQ(parsed.code, 2) << parsed.err;
  EXPECT_NE(parsed.err.find("use --accelerator cuda --devices N"), std::string::npos) << parsed.err;
  parsed = parse({"--resume-from-checkpoint", "last.ckpt"}, /*fabric=*/true);
  EXPECT_EQ(parsed.code, 2) << parsed.err;
  EXPECT_NE(parsed.err.find("unknown flag --resume-from-checkpoint"), std::string::npos) << parsed.err;
}

}  // namespace
}  // namespace retired_flags_test
}  // namespace lockstep
