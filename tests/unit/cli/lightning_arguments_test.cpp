// The user guide's table of Lightning's Trainer arguments ("### Lightning's Trainer arguments"):
// it lists every argument of Lightning 2.6's Trainer, each flag it marks `works` is accepted by
// the Trainer's flags as written, and each it marks `refused` exits with code 2 naming the
// alternative (the first `code` of the row's last column).
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <lockstep/cli/trainer_flags.h>

#include "../../support/command.h"
#include "../../support/paths.h"

namespace lockstep {
namespace lightning_arguments_test {

namespace fs = std::filesystem;

struct Row {
  std::string argument;  // "max_epochs"
  std::string flag;      // "--max-epochs 3", as typed
  bool works;
  std::string alternative;  // the first `code` of the last column
};

std::vector<Row> table_rows() {
  std::istringstream in(testing::slurp((fs::path(LOCKSTEP_SOURCE_DIR) / "docs/user-guide.md").string()));
  static const std::regex row(R"(^\| `([a-z_]+)` \| `([^`]+)` \| (works|refused) \| (.*)\|$)");
  static const std::regex code("`([^`]+)`");
  std::vector<Row> rows;
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind('#', 0) == 0) inside = line == "### Lightning's Trainer arguments";
    std::smatch match, first_code;
    if (!inside || !std::regex_match(line, match, row)) continue;
    const std::string rest = match[4];
    const bool coded = std::regex_search(rest, first_code, code);
    rows.push_back({match[1], match[2], match[3] == "works", coded ? first_code[1].str() : ""});
  }
  return rows;
}

std::set<std::string> arguments_of(const std::vector<Row>& rows) {
  std::set<std::string> names;
  for (const auto& r : rows) names.insert(r.argument);
  return names;
}

std::string listed(const std::set<std::string>& names) {
  std::string text;
  for (const auto& n : names) text += (text.empty() ? "" : ", ") + n;
  return text.empty() ? "(none)" : text;
}

// What `a` has that `b` lacks.
std::set<std::string> minus(const std::set<std::string>& a, const std::set<std::string>& b) {
  std::set<std::string> out;
  for (const auto& n : a) {
    if (!b.count(n)) out.insert(n);
  }
  return out;
}

// The parameters of Trainer.__init__ in Lightning's trainer/trainer.py, read from its text (an
// import of Lightning takes seconds): one "name: type = default," per line, up to "-> None:".
std::set<std::string> init_parameters(const std::string& source) {
  const auto from = source.find("    def __init__(\n");
  const auto to = source.find(") -> None:", from);
  if (from == std::string::npos || to == std::string::npos) return {};
  std::istringstream in(source.substr(from, to - from));
  static const std::regex parameter(R"(^        ([a-z_]+)\s*[:=,])");
  std::set<std::string> names;
  for (std::string line; std::getline(in, line);) {
    std::smatch match;
    if (std::regex_search(line, match, parameter)) names.insert(match[1]);
  }
  return names;
}

struct Parsed {
  int code;
  std::string err;
};

Parsed parse_trainer_flags(const std::string& typed) {
  TrainerOptions options;
  CLI::App app{"lightning arguments", "prog"};
  cli::add_trainer_flags(app, options);
  std::vector<std::string> args{"prog"};
  std::istringstream words(typed);
  for (std::string w; words >> w;) args.push_back(w);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  const int code = cli::parse_or_exit_code(app, static_cast<int>(argv.size()), argv.data());
  ::testing::internal::GetCapturedStdout();
  return {code, ::testing::internal::GetCapturedStderr()};
}

}  // namespace lightning_arguments_test

namespace {

using namespace lightning_arguments_test;

// Trainer.__init__'s parameters in pytorch-lightning 2.6.6 (the version .venv-libtorch2 pins:
// scripts/libtorch2-requirements.txt), but self.
const std::set<std::string> kLightning266 = {
    "accelerator", "strategy", "devices", "num_nodes", "precision", "logger", "callbacks", "fast_dev_run",
    "max_epochs", "min_epochs", "max_steps", "min_steps", "max_time", "limit_train_batches", "limit_val_batches",
    "limit_test_batches", "limit_predict_batches", "overfit_batches", "val_check_interval",
    "check_val_every_n_epoch", "num_sanity_val_steps", "log_every_n_steps", "enable_checkpointing",
    "enable_progress_bar", "enable_model_summary", "accumulate_grad_batches", "gradient_clip_val",
    "gradient_clip_algorithm", "deterministic", "benchmark", "inference_mode", "use_distributed_sampler", "profiler",
    "detect_anomaly", "barebones", "plugins", "sync_batchnorm", "reload_dataloaders_every_n_epochs",
    "default_root_dir", "enable_autolog_hparams", "model_registry"};

TEST(LightningArguments, TheTableListsEveryArgumentOfLightning266OnceAndNoOther) {
  const auto rows = table_rows();
  const auto names = arguments_of(rows);
  EXPECT_EQ(rows.size(), names.size()) << "an argument has two rows";
  EXPECT_EQ(kLightning266.size(), 41u);
  EXPECT_TRUE(minus(kLightning266, names).empty()) << "missing from the table: " << listed(minus(kLightning266, names));
  EXPECT_TRUE(minus(names, kLightning266).empty()) << "not Lightning's: " << listed(minus(names, kLightning266));
}

// Against the pytorch_lightning installed in .venv-libtorch2 (LOCKSTEP_LIBTORCH=pypi scripts/setup),
// whichever version that is; skipped without it.
TEST(LightningArguments, TheTableListsEveryArgumentOfTheInstalledLightning) {
  const fs::path lib = fs::path(LOCKSTEP_SOURCE_DIR) / ".venv-libtorch2" / "lib";
  fs::path trainer_py;
  std::error_code ignored;
  for (const auto& entry : fs::directory_iterator(lib, ignored)) {
    const auto candidate = entry.path() / "site-packages/pytorch_lightning/trainer/trainer.py";
    if (fs::exists(candidate, ignored)) trainer_py = candidate;
  }
  if (trainer_py.empty()) {
    GTEST_SKIP() << "no pytorch_lightning under " << lib.string()
                 << " (LOCKSTEP_LIBTORCH=pypi scripts/setup installs it); checked against the 2.6.6 list only";
  }
  std::string version = testing::slurp((trainer_py.parent_path().parent_path() / "version.info").string());
  version = version.substr(0, version.find('\n'));
  auto installed = init_parameters(testing::slurp(trainer_py.string()));
  installed.erase("self");
  ASSERT_GE(installed.size(), 30u) << "Trainer.__init__ not found in " << trainer_py.string();
  const auto names = arguments_of(table_rows());
  EXPECT_TRUE(minus(installed, names).empty())
      << "pytorch_lightning " << version << "'s Trainer has arguments the table lacks: " << listed(minus(installed, names));
  EXPECT_TRUE(minus(names, installed).empty())
      << "the table lists arguments that pytorch_lightning " << version << " lacks: " << listed(minus(names, installed));
}

TEST(LightningArguments, EveryWorkingFlagIsAcceptedAndEveryRefusedOneNamesTheAlternative) {
  const auto rows = table_rows();
  ASSERT_GE(rows.size(), 41u);
  int refused = 0;
  for (const auto& r : rows) {
    const auto parsed = parse_trainer_flags(r.flag);
    if (r.works) {
      EXPECT_EQ(parsed.code, -1) << r.argument << ": '" << r.flag << "' is marked works: " << parsed.err;
      continue;
    }
    ++refused;
    const std::string flag = r.flag.substr(0, r.flag.find(' '));
    EXPECT_EQ(parsed.code, 2) << r.argument << ": '" << r.flag << "' is marked refused: " << parsed.err;
    EXPECT_NE(parsed.err.find("prog: error: " + flag + ": "), std::string::npos) << parsed.err;
    ASSERT_FALSE(r.alternative.empty()) << r.argument << ": the row names no alternative in `code`";
    EXPECT_NE(parsed.err.find(r.alternative), std::string::npos)
        << r.argument << ": the message should name '" << r.alternative << "': " << parsed.err;
  }
  EXPECT_EQ(refused, 11);
}

// Values Lightning takes for flags that work: the ones Lockstep reads the same way, and the ones
// it refuses by value with the fix.
TEST(LightningArguments, LightningsValuesOfWorkingFlagsAreReadOrRefusedByValue) {
  TrainerOptions options;
  CLI::App app{"lightning values", "prog"};
  cli::add_trainer_flags(app, options);
  std::vector<std::string> args{"prog", "--profiler", "simple", "--num-sanity-val-steps", "-1"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  ASSERT_EQ(cli::parse_or_exit_code(app, static_cast<int>(argv.size()), argv.data()), -1);
  EXPECT_EQ(options.profiler(), "simple");
  EXPECT_EQ(options.num_sanity_val_steps(), -1);
  // Lightning's profiler=True is its simple profiler.
  for (const auto& [typed, read] : std::vector<std::pair<std::string, std::string>>{
           {"true", "simple"}, {"pytorch", "pytorch"}, {"false", ""}}) {
    TrainerOptions profiled;
    CLI::App profiler_app{"profiler values", "prog"};
    cli::add_trainer_flags(profiler_app, profiled);
    std::vector<std::string> words{"prog", "--profiler", typed};
    std::vector<char*> profiler_argv;
    for (auto& w : words) profiler_argv.push_back(w.data());
    ASSERT_EQ(cli::parse_or_exit_code(profiler_app, 3, profiler_argv.data()), -1) << typed;
    EXPECT_EQ(profiled.profiler(), read) << typed;
  }
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"--deterministic warn", "use --deterministic true"},
      {"--profiler advanced", "use --profiler simple (the time per hook and loop phase), --profiler pytorch"},
      {"--profiler xla", "is Lightning's Python profiler"},
      {"--profiler detailed", "detailed is not a profiler: use simple (or true), pytorch, or false"},
      {"--val-check-interval 00:00:05:00", "a time (DD:HH:MM:SS) is not available; pass a fraction"},
  };
  for (const auto& [typed, fix] : refused) {
    const auto parsed = parse_trainer_flags(typed);
    EXPECT_EQ(parsed.code, 2) << typed << ": " << parsed.err;
    EXPECT_NE(parsed.err.find(fix), std::string::npos) << typed << ": " << parsed.err;
  }
}

// The reader of Trainer.__init__ takes each parameter's name, whatever its type's shape.
TEST(LightningArguments, TheSignatureReaderTakesEveryParameter) {
  const std::string source =
      "class Trainer:\n    @_defaults_from_env_vars\n    def __init__(\n        self,\n        *,\n"
      "        accelerator: Union[str, Accelerator] = \"auto\",\n        max_time: Optional[Union[str, timedelta,\n"
      "            dict[str, int]]] = None,\n        barebones: bool = False,\n    ) -> None:\n"
      "        r\"\"\"\n        logger: not a parameter\n";
  EXPECT_EQ(init_parameters(source), (std::set<std::string>{"self", "accelerator", "max_time", "barebones"}));
}

}  // namespace
}  // namespace lockstep
