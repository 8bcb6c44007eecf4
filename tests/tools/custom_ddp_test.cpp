// examples/custom_ddp, run as a user runs it: `--strategy custom_ddp` selects the strategy the
// example registers, and the wrapper its configure_ddp returned is the one the training steps used.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>

#include "../support/command.h"
#include "../support/paths.h"
#include "../support/temp_dir.h"

namespace lockstep {
namespace custom_ddp_test {
namespace {

using testing::run_command;

const std::string custom_ddp_bin = std::string(LOCKSTEP_BIN_DIR) + "/custom_ddp";

std::map<std::string, std::string> plain_environment() {
  return {{"PATH", "/usr/bin:/bin"}, {"HOME", "/tmp"}, {"LOCKSTEP_NO_BLAS_WARNING", "1"}};
}

testing::CommandResult run_example(const std::string& root, std::vector<std::string> extra) {
  std::vector<std::string> argv{custom_ddp_bin,           "--devices",          "2",
                                "--enable-progress-bar",  "false",              "--enable-checkpointing",
                                "false",                  "--default-root-dir", root};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return run_command(argv, plain_environment(), std::chrono::seconds(60));
}

// The {"event":"custom_ddp",...} line of stdout (null if missing).
nlohmann::json custom_ddp_line(const testing::CommandResult& result) {
  for (const auto& line : result.out_lines()) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.is_object() && j.value("event", "") == "custom_ddp") return j;
  }
  return nullptr;
}

TEST(CustomDdpExample, RegisteredStrategyUsesItsOwnWrapper) {
  testing::TempDir dir("lockstep_custom_ddp");
  // 256 examples over 2 ranks = 128 each, in batches of 32: 4 training batches per epoch.
  auto result = run_example(dir.path(), {"--strategy", "custom_ddp", "--max-epochs", "1"});
  ASSERT_EQ(result.exit_code, 0) << result.err << result.out;
  const auto j = custom_ddp_line(result);
  ASSERT_FALSE(j.is_null()) << "no custom_ddp line in stdout:\n" << result.out << result.err;
  EXPECT_EQ(j["strategy"], "custom_ddp");
  EXPECT_EQ(j["wrapper"], "CountingDDP");
  EXPECT_EQ(j["world_size"], 2);
  EXPECT_EQ(j["train_batches"], 4);
  EXPECT_EQ(j["prepared_forwards"], 4);  // one prepared forward per training batch
}

TEST(CustomDdpExample, CountsEveryTrainingForwardOverEpochs) {
  testing::TempDir dir("lockstep_custom_ddp");
  // 200 examples over 2 ranks = 100 each, in batches of 16: 7 batches (last one short) x 2 epochs.
  auto result = run_example(dir.path(), {"--strategy", "custom_ddp", "--max-epochs", "2", "--samples", "200",
                                       "--batch-size", "16"});
  ASSERT_EQ(result.exit_code, 0) << result.err << result.out;
  const auto j = custom_ddp_line(result);
  ASSERT_FALSE(j.is_null()) << "no custom_ddp line in stdout:\n" << result.out << result.err;
  EXPECT_EQ(j["train_batches"], 7);
  EXPECT_EQ(j["epochs"], 2);
  EXPECT_EQ(j["prepared_forwards"], 14);
  EXPECT_EQ(j["world_size"], 2);
}

TEST(CustomDdpExample, UnknownStrategyListsTheRegisteredOnes) {
  testing::TempDir dir("lockstep_custom_ddp");
  auto result = run_example(dir.path(), {"--strategy", "not_registered", "--max-epochs", "1"});
  EXPECT_EQ(result.exit_code, 2) << result.err << result.out;
  EXPECT_NE(result.err.find("not_registered"), std::string::npos) << result.err;
  // custom_ddp is registered by the example binary itself, next to the library's own strategies.
  EXPECT_NE(result.err.find("custom_ddp"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("ddp_fork"), std::string::npos) << result.err;
  EXPECT_TRUE(custom_ddp_line(result).is_null()) << result.out;
}

}  // namespace
}  // namespace custom_ddp_test
}  // namespace lockstep
