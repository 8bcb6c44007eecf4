// The documentation's programs and the examples, built the way a user builds them: against the
// installed package (find_package(lockstep)), out of the tree. The documented programs begin with
// <lockstep/lockstep.h> (kPreamble), so they and the examples share one precompiled copy of that
// header; it compiled them in a third of the time, and an example in a fifth (22 s of CPU without
// it, 2026-12-02). That each example includes the Lockstep headers it uses is checked by the main
// build, which gives them only <torch/torch.h> precompiled.
// A C++ block in README.md or docs/*.md that holds `int main(` must be marked `<!-- compile -->`
// on the line before it; `<!-- compile: prefix -->` marks a block that later compiled blocks of
// the same file build on (a class defined once, used in the next block). README's "Use it in your
// project" marks its files `<!-- project: NAME -->` instead: they are built as the project they
// describe, against the package installed into a prefix, and run as its last command says.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../support/command.h"
#include "../support/paths.h"
#include "../support/temp_dir.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;
using testing::run_command;

const fs::path source_dir(LOCKSTEP_SOURCE_DIR);

struct Program {
  std::string name;  // README_58: the file and the line of the block
  std::string code;
};

const char* const kPreamble = "#include <lockstep/lockstep.h>\nusing namespace lockstep;\n";

// The compiled programs of one Markdown file; unmarked program blocks are test failures.
std::vector<Program> programs_in(const fs::path& markdown) {
  std::ifstream in(markdown);
  std::vector<Program> programs;
  std::string prefix, marker, line, previous;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line != "```cpp") {
      previous = line;
      continue;
    }
    const int first = number;
    std::string code;
    while (std::getline(in, line) && line != "```") {
      ++number;
      code += line + "\n";
    }
    ++number;
    const std::string name = markdown.stem().string() + "_" + std::to_string(first);
    if (previous == "<!-- compile: prefix -->") {
      prefix += code;
    } else if (previous == "<!-- compile -->") {
      programs.push_back({name, kPreamble + prefix + code});
    } else if (previous.rfind("<!-- project: ", 0) == 0) {
      // README's "Use it in your project": built as its own project (readme_project).
    } else if (code.find("int main(") != std::string::npos) {
      ADD_FAILURE() << markdown << ":" << first << " is a program but not marked <!-- compile -->";
    }
    previous.clear();
  }
  return programs;
}

std::vector<Program> documented_programs() {
  std::vector<Program> all = programs_in(source_dir / "README.md");
  for (const auto& entry : fs::directory_iterator(source_dir / "docs")) {
    if (entry.path().extension() != ".md") continue;
    for (auto& program : programs_in(entry.path())) all.push_back(std::move(program));
  }
  return all;
}

// README's "Use it in your project": the blocks marked `<!-- project: NAME -->` on the line before
// them, by NAME (CMakeLists.txt, main.cpp, and `commands`: the shell lines that build and run it).
std::map<std::string, std::string> readme_project() {
  std::ifstream in(source_dir / "README.md");
  static const std::regex marker(R"(<!-- project: (\S+) -->)");
  std::map<std::string, std::string> files;
  std::string name;
  for (std::string line; std::getline(in, line);) {
    std::smatch match;
    if (std::regex_match(line, match, marker)) {
      name = match[1];
    } else if (!name.empty() && line.rfind("```", 0) == 0) {
      std::string text;
      while (std::getline(in, line) && line != "```") text += line + "\n";
      files[name] = text;
      name.clear();
    }
  }
  return files;
}

// The words of the last line of `commands` (the one that runs the program), its comment left out.
std::vector<std::string> last_command(const std::string& commands) {
  std::istringstream lines(commands);
  std::string last;
  for (std::string line; std::getline(lines, line);) {
    if (line.find_first_not_of(' ') != std::string::npos) last = line.substr(0, line.find('#'));
  }
  std::istringstream words(last);
  std::vector<std::string> command;
  for (std::string word; words >> word;) command.push_back(word);
  return command;
}

// Installs the package under `scratch` and returns its prefix.
std::string installed_package(const testing::TempDir& scratch) {
  const std::string prefix = scratch / "prefix";
  const auto result = run_command({"/usr/bin/cmake", "--install", std::string(LOCKSTEP_BIN_DIR) + "/..", "--prefix", prefix},
                                  {{"PATH", "/usr/bin:/bin"}}, std::chrono::seconds(120));
  EXPECT_EQ(result.exit_code, 0) << result.out << result.err;
  return prefix;
}

// Configures and builds the CMake project in `project` against the package installed at `prefix`,
// into project/build. `scratch` holds both: the compiler cache takes paths under it as relative.
testing::CommandResult configure_and_build(const fs::path& project, const std::string& prefix,
                                           const std::string& scratch) {
  const std::map<std::string, std::string> env{{"PATH", "/usr/bin:/bin"}, {"HOME", "/tmp"}};
  // Torch where this build found it (PyPI's wheel for build-libtorch2; Debian's is found anyway).
  const std::string torch = LOCKSTEP_PREFIX_PATH;
  // Through the build's compiler cache, paths taken relative to the scratch folder: an unchanged
  // program compiles once per cache, not once per run (scripts/compiler-launcher).
  std::map<std::string, std::string> cache_env{{"PATH", "/usr/bin:/bin"}, {"HOME", "/tmp"}};
  for (const char* name : {"HOME", "CCACHE_DIR"}) {
    if (const char* value = std::getenv(name)) cache_env[name] = value;
  }
  const auto launcher =
      run_command({source_dir / "scripts/compiler-launcher", scratch}, cache_env, std::chrono::seconds(30)).out_lines();
  auto result = run_command({"/usr/bin/cmake", "-S", project, "-B", project / "build", "-G", "Ninja",
                             "-DCMAKE_PREFIX_PATH=" + prefix + (torch.empty() ? "" : ";" + torch),
                             "-DCMAKE_CXX_COMPILER_LAUNCHER=" + (launcher.empty() ? "" : launcher.front()),
                             // The package's own compiler (scripts/setup: clang++); scripts/test
                             // builds its package consumer with the system's default (g++).
                             std::string("-DCMAKE_CXX_COMPILER=") + LOCKSTEP_CXX_COMPILER,
                             // No optimisation: what is checked is that they compile, link and run.
                             "-DCMAKE_BUILD_TYPE=None"},
                            env, std::chrono::seconds(120));
  if (result.exit_code != 0) return result;
  return run_command({"/usr/bin/cmake", "--build", project / "build", "--parallel", "2"}, env, std::chrono::seconds(900));
}

// Builds every program as its own executable in a fresh project; returns the build's result.
testing::CommandResult build(const std::vector<Program>& programs, const std::vector<fs::path>& sources,
                             const std::string& prefix, const testing::TempDir& dir) {
  std::ofstream cmake(dir / "CMakeLists.txt");
  cmake << "cmake_minimum_required(VERSION 3.22)\nproject(docs_programs CXX)\nset(CMAKE_CXX_STANDARD 17)\n"
        << "find_package(lockstep REQUIRED)\n";
  const auto add = [&](const std::string& name, const std::string& file) {
    cmake << "add_executable(" << name << " " << file << ")\ntarget_link_libraries(" << name
          << " PRIVATE lockstep::lockstep)\n";
  };
  std::vector<std::string> targets;
  for (const auto& program : programs) {
    std::ofstream(dir / (program.name + ".cpp")) << program.code;
    add(program.name, program.name + ".cpp");
    targets.push_back(program.name);
  }
  for (const auto& source : sources) {
    add(source.parent_path().filename().string(), source.string());
    targets.push_back(source.parent_path().filename().string());
  }
  if (targets.size() >= 2) {  // a precompiled header pays off from two programs on
    cmake << "target_precompile_headers(" << targets.front() << " PRIVATE <lockstep/lockstep.h>)\n";
    for (size_t i = 1; i < targets.size(); ++i) {
      cmake << "target_precompile_headers(" << targets[i] << " REUSE_FROM " << targets.front() << ")\n";
    }
  }
  cmake.close();
  return configure_and_build(dir.path(), prefix, dir.path());
}

TEST(DocsCompile, EveryDocumentedProgramAndExampleBuildsAgainstTheInstalledPackage) {
  testing::TempDir dir("lockstep_docs");
  const auto programs = documented_programs();
  EXPECT_GE(programs.size(), 4u) << "README's two programs and the user guide's two";
  std::vector<fs::path> examples;
  for (const auto& entry : fs::directory_iterator(source_dir / "examples")) {
    if (fs::exists(entry.path() / "main.cpp")) examples.push_back(entry.path() / "main.cpp");
  }
  EXPECT_GE(examples.size(), 4u);
  const auto result = build(programs, examples, installed_package(dir), dir);
  EXPECT_EQ(result.exit_code, 0) << result.out << result.err;
  for (const auto& program : programs) EXPECT_TRUE(fs::exists(dir / ("build/" + program.name))) << program.name;

  // The guide's "DDP without the Trainer", run as the guide says: two ranks under `lockstep
  // launch`, rank 0 printing one line per epoch of Fashion-MNIST, the loss going down.
  const auto plain = std::find_if(programs.begin(), programs.end(), [](const Program& p) {
    return p.code.find("\"plain_ddp\"") != std::string::npos;
  });
  ASSERT_NE(plain, programs.end()) << "the user guide's DDP-without-the-Trainer program";
  const auto run = run_command({std::string(LOCKSTEP_BIN_DIR) + "/lockstep", "launch", "--nproc-per-node", "2", "--",
                                dir / ("build/" + plain->name)},
                               {{"PATH", "/usr/bin:/bin"}, {"HOME", "/tmp"}}, std::chrono::seconds(300));
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  const auto lines = run.out_lines();
  ASSERT_EQ(lines.size(), 3u) << run.out;
  std::vector<float> losses;
  for (size_t epoch = 0; epoch < lines.size(); ++epoch) {
    const std::string start = "epoch " + std::to_string(epoch) + ": loss ";
    ASSERT_EQ(lines[epoch].rfind(start, 0), 0u) << lines[epoch];
    losses.push_back(std::stof(lines[epoch].substr(start.size())));
  }
  EXPECT_LT(losses[0], 1.0f) << "one epoch of SGD on Fashion-MNIST ends near 0.6";
  EXPECT_LT(losses[2], losses[0]) << run.out;
}

// README's "Use it in your project", done as it says: the package installed into a prefix, the
// README's CMakeLists.txt and main.cpp built against it in a folder of their own, and its last
// command run there (`build/train --devices 2 --max-epochs 5`): the program starts rank 1 itself,
// each rank trains on half of the 2048 examples, and the epochs' mean loss falls.
TEST(DocsCompile, TheReadmeProjectTrainsOnTwoRanksAgainstTheInstalledPackage) {
  testing::TempDir dir("lockstep_readme_project");
  const auto files = readme_project();
  for (const char* name : {"CMakeLists.txt", "main.cpp", "commands"}) {
    ASSERT_TRUE(files.count(name)) << "README.md has no block marked <!-- project: " << name << " -->";
  }
  const fs::path project = dir / "project";
  fs::create_directories(project);
  for (const char* name : {"CMakeLists.txt", "main.cpp"}) std::ofstream(project / name) << files.at(name);
  const auto built = configure_and_build(project, installed_package(dir), dir.path());
  ASSERT_EQ(built.exit_code, 0) << built.out << built.err;

  auto command = last_command(files.at("commands"));
  ASSERT_FALSE(command.empty());
  ASSERT_EQ(command.front(), "build/train") << "README's last command runs the program it built";
  command.insert(command.begin(), {"/usr/bin/env", "-C", project.string()});  // run in the project's folder
  const auto run = run_command(command, {{"PATH", "/usr/bin:/bin"}, {"HOME", "/tmp"}}, std::chrono::seconds(120));
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  const auto lines = run.out_lines();
  const auto end = std::find_if(lines.begin(), lines.end(),
                                [](const std::string& line) { return line.find("\"event\":\"fit_end\"") != std::string::npos; });
  ASSERT_NE(end, lines.end()) << run.out;
  const auto fit_end = nlohmann::json::parse(*end);
  EXPECT_EQ(fit_end.at("world_size"), 2) << *end;
  EXPECT_EQ(fit_end.at("global_step"), 5 * 16) << "5 epochs of 1024 examples a rank in batches of 64: " << *end;

  // Rank 0's line per epoch, "Epoch N done: ...; train_loss=X" (the epoch's mean): one each.
  const std::regex done(R"(^Epoch (\d+) done: .*train_loss=([0-9.e+-]+))");
  std::vector<double> means;
  std::istringstream err(run.err);
  for (std::string line; std::getline(err, line);) {
    std::smatch match;
    if (!std::regex_search(line, match, done)) continue;
    EXPECT_EQ(std::stoul(match[1]), means.size()) << line;
    means.push_back(std::stod(match[2]));
  }
  ASSERT_EQ(means.size(), 5u) << run.err;
  // Measured 0.96 in the first epoch and 0.0936 in the fifth (2026-12-05).
  EXPECT_LT(means.back(), means.front() / 2) << run.err;
}

// The same machinery fails, naming the block, when a block is broken (here: README's first
// program calling a function that does not exist).
TEST(DocsCompile, ABrokenBlockFailsTheBuildNamingIt) {
  testing::TempDir dir("lockstep_docs_broken");
  auto programs = documented_programs();
  ASSERT_FALSE(programs.empty());
  Program broken = programs.front();
  broken.code += "void broken() { lockstep::no_such_function(); }\n";
  const auto result = build({broken}, {}, installed_package(dir), dir);
  EXPECT_NE(result.exit_code, 0) << "a broken block built";
  EXPECT_NE((result.out + result.err).find(broken.name + ".cpp"), std::string::npos) << result.out << result.err;
  EXPECT_NE((result.out + result.err).find("no_such_function"), std::string::npos) << result.out << result.err;
}

// Every test that tests/ defines, as "Suite.Case": TEST, TEST_F and TEST_P, whatever the spacing.
std::set<std::string> defined_tests() {
  std::set<std::string> names;
  const std::regex test(R"(\bTEST(?:_F|_P)?\(\s*(\w+)\s*,\s*(\w+)\s*\))");
  for (const auto& entry : fs::recursive_directory_iterator(source_dir / "tests")) {
    if (entry.path().extension() != ".cpp") continue;
    const std::string code = testing::slurp(entry.path().string());
    for (std::sregex_iterator it(code.begin(), code.end(), test), end; it != end; ++it) {
      names.insert((*it)[1].str() + "." + (*it)[2].str());
    }
  }
  return names;
}

// The tests a text names, as `Suite.Case` in backticks.
std::vector<std::string> named_tests(const std::string& text) {
  static const std::regex named("`([A-Za-z_][A-Za-z0-9_]*\\.[A-Z][A-Za-z0-9_]*)`");
  std::vector<std::string> names;
  for (std::sregex_iterator it(text.begin(), text.end(), named), end; it != end; ++it) names.push_back((*it)[1]);
  return names;
}

// docs/launching.md points each recipe at the test that runs it: every `Suite.Name` it names is a
// test of tests/ (TEST, TEST_F or TEST_P), so that the pointer cannot go stale.
TEST(DocsLaunching, EveryRecipeNamesATestThatExists) {
  const auto tests = defined_tests();
  const auto named = named_tests(testing::slurp((source_dir / "docs/launching.md").string()));
  for (const auto& name : named) EXPECT_TRUE(tests.count(name)) << name << " is named in docs/launching.md but is no test";
  EXPECT_GE(named.size(), 8u) << "a test for each recipe";
}

// docs/seeds.md, the seeds' behaviours against Lockstep's: every row of its tables names, in its
// last cell, at least one test, and every test it names is in tests/.
TEST(DocsSeeds, EveryRowNamesTestsThatExist) {
  const auto tests = defined_tests();
  std::ifstream in(source_dir / "docs/seeds.md");
  int rows = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("| ", 0) != 0 || line.rfind("| seed |", 0) == 0) continue;
    ++rows;
    const std::string last = line.substr(line.rfind('|', line.size() - 2));
    const auto named = named_tests(last);
    EXPECT_FALSE(named.empty()) << "docs/seeds.md: a row names no test: " << line;
    for (const auto& name : named) EXPECT_TRUE(tests.count(name)) << name << " is named in docs/seeds.md but is no test";
  }
  EXPECT_GE(rows, 40) << "the five seeds' behaviours";
}

// An option's default as a header states it: the value it is initialised with
// (`TORCH_ARG(type, name) = value;`) and the value its comment gives ("Default: value.").
struct StatedDefault {
  std::string value;
  std::string comment;
};

// The TORCH_ARG fields of a header's text, by name.
std::map<std::string, StatedDefault> header_defaults(const std::string& header) {
  static const std::regex field(R"(TORCH_ARG\(\s*[^,]+,\s*(\w+)\s*\)\s*=\s*([^;]+);)");
  std::map<std::string, StatedDefault> defaults;
  size_t comment_from = 0;  // where the comments above the current field begin
  for (std::sregex_iterator it(header.begin(), header.end(), field), end; it != end; ++it) {
    const std::string above = header.substr(comment_from, static_cast<size_t>(it->position(0)) - comment_from);
    comment_from = static_cast<size_t>(it->position(0) + it->length(0));
    std::string comment;
    const size_t at = above.rfind("Default: ");
    if (at != std::string::npos) {
      const size_t from = at + 9;
      size_t to = above[from] == '"' ? above.find('"', from + 1) + 1 : above.find_first_of(" \n", from);
      comment = above.substr(from, to - from);
      if (above[from] != '"' && !comment.empty() && comment.back() == '.') comment.pop_back();
    }
    defaults[(*it)[1]] = {(*it)[2], comment};
  }
  return defaults;
}

// Two spellings of one default: the value before any words that explain it ("unset: true for
// ..."), quotes and backticks dropped, numbers compared as numbers (1800 and 1800.0), "(none)" for
// "", "unset" for std::nullopt.
bool same_default(std::string a, std::string b) {
  const auto bare = [](std::string v) {
    if (v == "(none)") return std::string();
    if (v.rfind("std::", 0) != 0) v = v.substr(0, v.find_first_of(" ,:;"));
    v.erase(std::remove_if(v.begin(), v.end(), [](char c) { return c == '`' || c == '"'; }), v.end());
    return v == "std::nullopt" ? std::string("unset") : v;
  };
  a = bare(a);
  b = bare(b);
  char* end_a = nullptr;
  char* end_b = nullptr;
  const double x = std::strtod(a.c_str(), &end_a), y = std::strtod(b.c_str(), &end_b);
  if (!a.empty() && !b.empty() && *end_a == '\0' && *end_b == '\0') return x == y;
  return a == b;
}

// Where the docs and the headers disagree on a default, one line each: a table row of `doc`
// under `heading` ("| `--max-epochs` | -1 | ...": a flag, read as the field max_epochs, or "|
// `bucket_cap_mb` | 25 | ...") whose default cell is not the field's value; a field of `defaults`
// the table lacks; a header comment that gives another value than the code. `described` are
// cells that describe an empty default in words ("gloo on CPU, nccl on CUDA"); `not_in_table` are
// fields that are no flag (the text around the table names them instead); `no_field` are rows of
// flags that set no field (--config).
std::vector<std::string> default_mismatches(const std::string& doc, const std::string& heading,
                                            const std::map<std::string, StatedDefault>& defaults,
                                            const std::map<std::string, std::string>& described = {},
                                            const std::set<std::string>& not_in_table = {},
                                            const std::set<std::string>& no_field = {}) {
  std::vector<std::string> mismatches;
  std::set<std::string> documented;
  std::istringstream in(doc);
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind('#', 0) == 0) inside = line == heading;
    static const std::regex row(R"(^\| `(--)?([a-z0-9_-]+)` \| ([^|]*[^ |]) \|)");
    std::smatch match;
    if (!inside || !std::regex_search(line, match, row)) continue;
    std::string name = match[2];
    std::replace(name.begin(), name.end(), '-', '_');
    const std::string cell = match[3];
    if (no_field.count(name)) continue;
    const auto field = defaults.find(name);
    if (field == defaults.end()) {
      mismatches.push_back(heading + ": " + match[1].str() + match[2].str() + " is no option of the header");
      continue;
    }
    documented.insert(name);
    const auto words = described.find(name);
    const bool as_described = words != described.end() && cell == words->second && same_default(field->second.value, "");
    if (!as_described && !same_default(cell, field->second.value)) {
      mismatches.push_back(heading + ": " + name + " is documented as " + cell + ", the header sets " + field->second.value);
    }
  }
  for (const auto& [name, stated] : defaults) {
    if (not_in_table.count(name)) {
      if (doc.find("`." + name + "(") == std::string::npos) mismatches.push_back(name + ": the docs never name it");
    } else if (!documented.count(name)) {
      mismatches.push_back(heading + ": " + name + " is not in the table");
    }
    if (stated.comment.empty()) {
      mismatches.push_back(name + ": its comment gives no \"Default: \"");
    } else if (!same_default(stated.comment, stated.value)) {
      mismatches.push_back(name + ": its comment says Default: " + stated.comment + ", the code sets " + stated.value);
    }
  }
  return mismatches;
}

// The defaults the user guide's tables state are the headers': the Trainer flags (TrainerOptions
// and the PlanOptions it shares with Fabric) and the DDP options, each field with a row (but
// trainer_variables, which is no flag), and each header comment's "Default:" the value the code sets.
TEST(DocsDefaults, TheTablesAndTheHeaderCommentsGiveTheHeadersDefaults) {
  const std::string guide = testing::slurp((source_dir / "docs/user-guide.md").string());
  const auto header = [](const char* path) { return testing::slurp((source_dir / "include/lockstep" / path).string()); };
  auto trainer = header_defaults(header("trainer/trainer_options.h"));
  const auto plan = header_defaults(header("plan/plan_options.h"));
  trainer.insert(plan.begin(), plan.end());
  const auto ddp = header_defaults(header("distributed/ddp/ddp_options.h"));
  EXPECT_GE(trainer.size(), 33u);
  EXPECT_GE(ddp.size(), 8u);
  const std::map<std::string, std::string> described{{"process_group_backend", "gloo on CPU, nccl on CUDA"}};
  // Whether the Trainer and Fabric read LOCKSTEP_TRAINER_* themselves: no flag, as flags read them;
  // configure_strategy: a function, set in code or by the --fsdp-* flags (their own table).
  // --config and --print-config read and write the flags (cli/yaml_config.h), and set no field.
  auto mismatches = default_mismatches(guide, "### Trainer flags", trainer, described,
                                       {"trainer_variables", "configure_strategy"}, {"config", "print_config"});
  const auto of_ddp = default_mismatches(guide, "## DDP options", ddp);
  mismatches.insert(mismatches.end(), of_ddp.begin(), of_ddp.end());
  for (const auto& m : mismatches) ADD_FAILURE() << m;
}

// The check names a table row that states another default, a field without a row, a comment that
// disagrees with the code, and a row of no field; it takes 1800 for 1800.0, (none) for "" and
// "unset: ..." for std::nullopt.
TEST(DocsDefaults, ADefaultThatDiffersIsNamed) {
  const std::string header =
      "  /// Seconds. Default: 1800.\n  TORCH_ARG(double, timeout) = 1800.0;\n"
      "  /// Resume from. Default: \"\" (start fresh).\n  TORCH_ARG(std::string, ckpt_path) = \"\";\n"
      "  /// Epochs. Default: 3.\n  TORCH_ARG(int64_t, max_epochs) = -1;\n"
      "  /// Steps. Default: -1.\n  TORCH_ARG(int64_t, max_steps) = -1;\n"
      "  /// Mode. Default: \"off\".\n  TORCH_ARG(std::string, debug) = \"off\";\n"
      "  /// Each wrapper's. Default: unset, which means true.\n  TORCH_ARG(std::optional<bool>, broadcast) = std::nullopt;\n";
  const std::string doc =
      "### Flags\n\n| flag | default | meaning |\n| --- | --- | --- |\n"
      "| `--timeout` | 1800 | seconds |\n| `--ckpt-path` | (none) | resume |\n"
      "| `--max-epochs` | -1 | epochs |\n| `--debug` | `on` | mode |\n| `--gone` | 1 | removed |\n"
      "| `--broadcast` | unset: true for DDP | buffers |\n"
      "## Other\n\n| `--max-steps` | -1 | a row of another table |\n";
  const auto mismatches = default_mismatches(doc, "### Flags", header_defaults(header));
  const std::vector<std::string> expected = {
      "### Flags: --gone is no option of the header",
      "### Flags: debug is documented as `on`, the header sets \"off\"",
      "### Flags: max_steps is not in the table",
      "max_epochs: its comment says Default: 3, the code sets -1",
  };
  std::vector<std::string> sorted = mismatches;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, expected) << "got:\n" << [&] {
    std::string all;
    for (const auto& m : mismatches) all += m + "\n";
    return all;
  }();
}

// The lines of the ```cpp block of `markdown` whose first line starts with `first`.
std::vector<std::string> block_starting_with(const fs::path& markdown, const std::string& first) {
  std::ifstream in(markdown);
  std::vector<std::string> lines;
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    if (!inside) {
      if (line == "```cpp" && std::getline(in, line) && line.rfind(first, 0) == 0) inside = true;
      continue;
    }
    if (line == "```") break;
    lines.push_back(line);
  }
  return lines;
}

// Lines of `a` and `b` in their longest common subsequence.
size_t common_lines(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  std::vector<std::vector<size_t>> lcs(a.size() + 1, std::vector<size_t>(b.size() + 1, 0));
  for (size_t i = a.size(); i-- > 0;) {
    for (size_t j = b.size(); j-- > 0;) {
      lcs[i][j] = a[i] == b[j] ? lcs[i + 1][j + 1] + 1 : std::max(lcs[i + 1][j], lcs[i][j + 1]);
    }
  }
  return lcs[0][0];
}

// The README's plain loop and its Fabric version in the user guide differ in the 6 lines the
// guide marks `// Fabric` (Lightning's conversion guide touches 6), and in nothing else.
TEST(DocsFabric, TheFabricLoopDiffersFromTheReadmeLoopInSixLines) {
  const auto plain = block_starting_with(source_dir / "README.md", "// The plain loop (");
  const auto fabric = block_starting_with(source_dir / "docs/user-guide.md", "// The plain loop, with Fabric");
  ASSERT_GT(plain.size(), 15u);
  ASSERT_GT(fabric.size(), 15u);
  const size_t common = common_lines(plain, fabric);
  size_t marked = 0;
  for (const auto& line : fabric) marked += line.size() >= 9 && line.compare(line.size() - 9, 9, "// Fabric") == 0;
  EXPECT_EQ(fabric.size() - common, 6u) << "lines written for Fabric";
  EXPECT_EQ(marked, 6u) << "each of them marked // Fabric";
  EXPECT_EQ(plain.size() - common, 4u) << "lines of the plain loop replaced";
}

// scripts/demo writes its runs under demo_runs/ in the checkout: git ignores them, so the demo
// leaves the tree clean.
TEST(Demo, ItsRunsAreIgnoredByGit) {
  const auto result = run_command({"/usr/bin/git", "-C", source_dir.string(), "check-ignore", "-q",
                                   "demo_runs/lockstep_logs/version_0/metrics.csv"},
                                  {{"PATH", "/usr/bin:/bin"}, {"HOME", "/tmp"}}, std::chrono::seconds(30));
  EXPECT_EQ(result.exit_code, 0) << "demo_runs/ is not ignored: " << result.out << result.err;
}

}  // namespace
}  // namespace lockstep
