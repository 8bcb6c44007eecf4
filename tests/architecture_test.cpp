// The folders of include/lockstep and src/lockstep depend one way: a folder includes only folders
// of lower layers (docs/architecture.md draws them). This test reads every `#include <lockstep/...>`
// and fails on an edge that goes up or sideways, naming the file and the line.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
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
    {"plan"},                                     // options + environment -> one plan; precision, GradScaler
    {"loggers", "callbacks"},                     // see the Trainer through TrainerView
    {"trainer", "fabric"},                        // siblings on one plan: the Trainer's loops, your own loop
    {"cli"},                                      // flags and the guarded main
};

std::map<std::string, int> layer_of() {
  std::map<std::string, int> layer;
  for (int i = 0; i < static_cast<int>(kLayers.size()); ++i) {
    for (const auto& folder : kLayers[i]) layer[folder] = i;
  }
  return layer;
}

// One violation per line: "src/lockstep/core/x.cpp:3: core includes trainer/trainer.h".
std::vector<std::string> layering_violations(const fs::path& root) {
  static const std::regex include_line(R"(^\s*#\s*include\s*<lockstep/(([a-z_]+)/[^>]+)>)");
  const auto layer = layer_of();
  std::vector<std::string> violations;
  for (const std::string base : {"include/lockstep", "src/lockstep"}) {
    if (!fs::exists(root / base)) continue;
    for (const auto& entry : fs::recursive_directory_iterator(root / base)) {
      if (!entry.is_regular_file()) continue;
      const auto relative = fs::relative(entry.path(), root / base);
      if (relative.begin() == relative.end() || std::next(relative.begin()) == relative.end()) continue;  // lockstep.h
      const std::string from = relative.begin()->string();
      std::ifstream in(entry.path());
      std::string line;
      for (int number = 1; std::getline(in, line); ++number) {
        std::smatch match;
        if (!std::regex_search(line, match, include_line) || match[2] == from) continue;
        const std::string to = match[2];
        const std::string where = base + "/" + relative.string() + ":" + std::to_string(number) + ": ";
        if (!layer.count(from)) {
          violations.push_back(where + "folder " + from + " has no layer in tests/architecture_test.cpp");
        } else if (!layer.count(to)) {
          violations.push_back(where + "includes folder " + to + ", which has no layer");
        } else if (layer.at(to) >= layer.at(from)) {
          violations.push_back(where + from + " includes " + match[1].str() +
                               (layer.at(to) == layer.at(from) ? " (same layer)" : " (a higher layer)"));
        }
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

// The check itself fails on an edge against the layering (core reaching up to the Trainer, as
// TrainingModule once did) and on a sideways one (callbacks and loggers are peers).
TEST(Architecture, AnEdgeAgainstTheLayeringIsNamed) {
  testing::TempDir dir("lockstep_layers");
  fs::create_directories(dir / "src/lockstep/core");
  fs::create_directories(dir / "src/lockstep/callbacks");
  fs::create_directories(dir / "src/lockstep/data");
  std::ofstream(dir / "src/lockstep/core/training_module.cpp")
      << "#include <lockstep/core/training_module.h>\n#include <lockstep/trainer/trainer.h>\n";
  std::ofstream(dir / "src/lockstep/callbacks/lr_monitor.cpp") << "#include <lockstep/loggers/logger.h>\n";
  std::ofstream(dir / "src/lockstep/data/sampler.cpp") << "#include <lockstep/core/error.h>\n";
  const auto violations = layering_violations(dir.path());
  ASSERT_EQ(violations.size(), 2u);
  const std::string all = violations[0] + "\n" + violations[1];
  EXPECT_NE(all.find("src/lockstep/core/training_module.cpp:2: core includes trainer/trainer.h (a higher layer)"),
            std::string::npos) << all;
  EXPECT_NE(all.find("src/lockstep/callbacks/lr_monitor.cpp:1: callbacks includes loggers/logger.h (same layer)"),
            std::string::npos) << all;
}

}  // namespace
}  // namespace lockstep
