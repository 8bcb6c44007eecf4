// The documentation's programs and the examples, built the way a user builds them: against the
// installed package (find_package(lockstep)), out of the tree. The examples compile on their own
// includes alone. The documented programs begin with <lockstep/lockstep.h> (kPreamble), so they
// share one precompiled copy of that header; it compiled them in a third of the time.
// A C++ block in README.md or docs/*.md that holds `int main(` must be marked `<!-- compile -->`
// on the line before it; `<!-- compile: prefix -->` marks a block that later compiled blocks of
// the same file build on (a class defined once, used in the next block).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

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

// Installs the package under `scratch` and returns its prefix.
std::string installed_package(const testing::TempDir& scratch) {
  const std::string prefix = scratch / "prefix";
  const auto result = run_command({"/usr/bin/cmake", "--install", std::string(LOCKSTEP_BIN_DIR) + "/..", "--prefix", prefix},
                                  {{"PATH", "/usr/bin:/bin"}}, std::chrono::seconds(120));
  EXPECT_EQ(result.exit_code, 0) << result.out << result.err;
  return prefix;
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
  for (const auto& program : programs) {
    std::ofstream(dir / (program.name + ".cpp")) << program.code;
    add(program.name, program.name + ".cpp");
    if (programs.size() < 2) continue;  // a precompiled header pays off from two programs on
    if (&program == &programs.front()) {
      cmake << "target_precompile_headers(" << program.name << " PRIVATE <lockstep/lockstep.h>)\n";
    } else {
      cmake << "target_precompile_headers(" << program.name << " REUSE_FROM " << programs.front().name << ")\n";
    }
  }
  for (const auto& source : sources) add(source.parent_path().filename().string(), source.string());
  cmake.close();
  const std::map<std::string, std::string> env{{"PATH", "/usr/bin:/bin"}, {"HOME", "/tmp"}};
  // Torch where this build found it (PyPI's wheel for build-libtorch2; Debian's is found anyway).
  const std::string torch = LOCKSTEP_PREFIX_PATH;
  auto result = run_command({"/usr/bin/cmake", "-S", dir.path(), "-B", dir / "build", "-G", "Ninja",
                             "-DCMAKE_PREFIX_PATH=" + prefix + (torch.empty() ? "" : ";" + torch),
                             // No optimisation: what is checked is that they compile, link and run.
                             "-DCMAKE_BUILD_TYPE=None"},
                            env, std::chrono::seconds(120));
  if (result.exit_code != 0) return result;
  return run_command({"/usr/bin/cmake", "--build", dir / "build", "--parallel", "2"}, env, std::chrono::seconds(900));
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

// docs/launching.md points each recipe at the test that runs it: every `Suite.Name` it names is a
// test of tests/ (TEST, TEST_F or TEST_P), so that the pointer cannot go stale.
TEST(DocsLaunching, EveryRecipeNamesATestThatExists) {
  std::string sources;
  for (const auto& entry : fs::recursive_directory_iterator(source_dir / "tests")) {
    if (entry.path().extension() == ".cpp") sources += testing::slurp(entry.path().string());
  }
  const std::string doc = testing::slurp((source_dir / "docs/launching.md").string());
  const std::regex named("`([A-Z][A-Za-z]+)\\.([A-Z][A-Za-z]+)`");
  int checked = 0;
  for (std::sregex_iterator it(doc.begin(), doc.end(), named), end; it != end; ++it, ++checked) {
    const std::regex test("TEST(_F|_P)?\\(" + (*it)[1].str() + ", " + (*it)[2].str() + "\\)");
    EXPECT_TRUE(std::regex_search(sources, test)) << (*it)[0] << " is named in docs/launching.md but is no test";
  }
  EXPECT_GE(checked, 8) << "a test for each recipe";
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
