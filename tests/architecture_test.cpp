// The folders of include/lockstep and src/lockstep depend one way: a folder includes only folders
// of lower layers (docs/architecture.md draws them). This test reads every `#include <lockstep/...>`
// and every `#include "..."` (resolved beside the including file, then under include/ and src/),
// and fails on an edge that goes up or sideways, naming the file and the line.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "support/paths.h"
#include "support/temp_dir.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;

// Lowest first; folders of one layer do not include each other.
const std::vector<std::vector<std::string>> kLayers = {
    {"core"},                                     // errors, seeding, TrainingModule and TrainerView
    {"data", "checkpoint"},                       // datasets, loaders, samplers; checkpoint files
    {"distributed"},                              // process groups, collectives, DDP
    {"environments", "launchers", "accelerators"},  // where each process sits, how it starts
    {"strategies"},                               // single, ddp, ddp_separate
    {"loggers", "callbacks"},                     // see the Trainer through TrainerView
    {"trainer"},                                  // orchestration
    {"fabric"},                                   // your own loop on the trainer's connector and precision
    {"cli"},                                      // flags and the guarded main
};

const std::vector<std::string> kBases = {"include/lockstep", "src/lockstep"};

std::map<std::string, int> layer_of() {
  std::map<std::string, int> layer;
  for (int i = 0; i < static_cast<int>(kLayers.size()); ++i) {
    for (const auto& folder : kLayers[i]) layer[folder] = i;
  }
  return layer;
}

struct SourceFile {
  fs::path path;      // on disk
  std::string shown;  // "src/lockstep/core/x.cpp"
  std::string folder;  // "core"; "" for a file directly under lockstep/ (lockstep.h)
};

std::vector<SourceFile> source_files(const fs::path& root) {
  std::vector<SourceFile> files;
  for (const std::string& base : kBases) {
    if (!fs::exists(root / base)) continue;
    for (const auto& entry : fs::recursive_directory_iterator(root / base)) {
      if (!entry.is_regular_file()) continue;
      const auto relative = fs::relative(entry.path(), root / base);
      const bool nested = std::next(relative.begin()) != relative.end();
      files.push_back({entry.path(), base + "/" + relative.string(), nested ? relative.begin()->string() : ""});
    }
  }
  std::sort(files.begin(), files.end(), [](const auto& a, const auto& b) { return a.shown < b.shown; });
  return files;
}

// The folder under include/lockstep or src/lockstep that `path` lies in, and the path below
// lockstep/ ("trainer/trainer.h"); nothing for a file elsewhere or directly under lockstep/.
std::optional<std::pair<std::string, std::string>> lockstep_folder(const fs::path& root, const fs::path& path) {
  for (const std::string& base : kBases) {
    const auto relative = path.lexically_relative((root / base).lexically_normal());
    if (relative.empty() || *relative.begin() == "..") continue;
    if (std::next(relative.begin()) == relative.end()) return std::nullopt;
    return std::make_pair(relative.begin()->string(), relative.generic_string());
  }
  return std::nullopt;
}

// Where `#include "name"` in `from` leads, as the compiler looks: beside the including file, then
// under include/ and src/ (the library's include paths); a name found nowhere is taken as a public
// header when it starts with lockstep/, else as beside the file.
fs::path resolve_quoted(const fs::path& root, const fs::path& from, const std::string& name) {
  const fs::path beside = (from.parent_path() / name).lexically_normal();
  if (fs::exists(beside)) return beside;
  for (const char* dir : {"include", "src"}) {
    if (fs::exists(root / dir / name)) return (root / dir / name).lexically_normal();
  }
  if (name.rfind("lockstep/", 0) == 0) return (root / "include" / name).lexically_normal();
  return beside;
}

// One violation per line: "src/lockstep/core/x.cpp:3: core includes trainer/trainer.h (a higher layer)".
std::vector<std::string> layering_violations(const fs::path& root_given) {
  static const std::regex angle(R"(^\s*#\s*include\s*<(lockstep/[^>]+)>)");
  static const std::regex quoted(R"re(^\s*#\s*include\s*"([^"]+)")re");
  const fs::path root = fs::absolute(root_given).lexically_normal();
  const auto layer = layer_of();
  std::vector<std::string> violations;
  for (const auto& file : source_files(root)) {
    if (file.folder.empty()) continue;  // lockstep.h includes everything
    std::ifstream in(file.path);
    std::string line;
    for (int number = 1; std::getline(in, line); ++number) {
      std::smatch match;
      fs::path target;
      std::string spelled;  // how a quoted include wrote it
      if (std::regex_search(line, match, angle)) {
        target = root / "include" / match[1].str();
      } else if (std::regex_search(line, match, quoted)) {
        target = resolve_quoted(root, fs::absolute(file.path).lexically_normal(), match[1]);
        spelled = match[1];
      } else {
        continue;
      }
      const auto to = lockstep_folder(root, target.lexically_normal());
      if (!to || to->first == file.folder) continue;
      const std::string where = file.shown + ":" + std::to_string(number) + ": ";
      const std::string what = to->second + (spelled.empty() ? "" : " through \"" + spelled + "\"");
      if (!layer.count(file.folder)) {
        violations.push_back(where + "folder " + file.folder + " has no layer in tests/architecture_test.cpp");
      } else if (!layer.count(to->first)) {
        violations.push_back(where + "includes folder " + to->first + ", which has no layer");
      } else if (layer.at(to->first) >= layer.at(file.folder)) {
        violations.push_back(where + file.folder + " includes " + what +
                             (layer.at(to->first) == layer.at(file.folder) ? " (same layer)" : " (a higher layer)"));
      }
    }
  }
  return violations;
}

TEST(Architecture, FoldersDependOneWay) {
  const auto violations = layering_violations(LOCKSTEP_SOURCE_DIR);
  for (const auto& v : violations) ADD_FAILURE() << v;
  EXPECT_TRUE(violations.empty());
}

void write(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string all;
  for (const auto& line : lines) all += line + "\n";
  return all;
}

// The check itself fails on an edge against the layering (core reaching up to the Trainer, as
// TrainingModule once did), on a sideways one (callbacks and loggers are peers), and on both
// through quoted includes, beside the file ("../") or through the include path.
TEST(Architecture, AnEdgeAgainstTheLayeringIsNamed) {
  testing::TempDir dir("lockstep_layers");
  const fs::path root = dir.path();
  write(root / "src/lockstep/core/training_module.cpp",
        "#include <lockstep/core/training_module.h>\n#include <lockstep/trainer/trainer.h>\n");
  write(root / "src/lockstep/callbacks/lr_monitor.cpp", "#include <lockstep/loggers/logger.h>\n");
  write(root / "src/lockstep/data/sampler.cpp", "#include <lockstep/core/error.h>\n");
  // Quoted: beside the file (same folder, fine), up through "../", sideways through include/.
  write(root / "include/lockstep/loggers/logger.h", "#pragma once\n");
  write(root / "src/lockstep/trainer/trainer_internal.h", "#pragma once\n");
  write(root / "src/lockstep/launchers/process_utils.h", "#pragma once\n");
  write(root / "src/lockstep/launchers/supervisor.cpp",
        "#include \"process_utils.h\"\n#include \"lockstep/core/error.h\"\n");
  write(root / "src/lockstep/core/seed.cpp", "#include <lockstep/core/seed.h>\n\n#include \"../trainer/trainer_internal.h\"\n");
  write(root / "src/lockstep/callbacks/early_stopping.cpp", "#include \"lockstep/loggers/logger.h\"\n");
  write(root / "src/lockstep/data/sub/deep.cpp", "#include \"../../launchers/process_utils.h\"\n");

  const auto violations = layering_violations(root);
  const std::string all = joined(violations);
  ASSERT_EQ(violations.size(), 5u) << all;
  EXPECT_NE(all.find("src/lockstep/core/training_module.cpp:2: core includes trainer/trainer.h (a higher layer)"),
            std::string::npos) << all;
  EXPECT_NE(all.find("src/lockstep/callbacks/lr_monitor.cpp:1: callbacks includes loggers/logger.h (same layer)"),
            std::string::npos) << all;
  EXPECT_NE(all.find("src/lockstep/core/seed.cpp:3: core includes trainer/trainer_internal.h through "
                     "\"../trainer/trainer_internal.h\" (a higher layer)"),
            std::string::npos) << all;
  EXPECT_NE(all.find("src/lockstep/callbacks/early_stopping.cpp:1: callbacks includes loggers/logger.h through "
                     "\"lockstep/loggers/logger.h\" (same layer)"),
            std::string::npos) << all;
  EXPECT_NE(all.find("src/lockstep/data/sub/deep.cpp:1: data includes launchers/process_utils.h through "
                     "\"../../launchers/process_utils.h\" (a higher layer)"),
            std::string::npos) << all;
}

}  // namespace
}  // namespace lockstep
