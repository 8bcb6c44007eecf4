// Five rules of the source tree, each with a self-test on a synthetic tree:
// - The folders of include/lockstep and src/lockstep depend one way: a folder includes only folders
//   of lower layers (docs/architecture.md draws them). Every `#include <lockstep/...>` and every
//   `#include "..."` (resolved beside the including file, then under include/ and src/) is read; an
//   edge that goes up or sideways fails, naming the file and the line.
// - Every error Lockstep raises on purpose is a lockstep::Error: a `throw` of anything else, a
//   std:: or c10:: exception built in place, TORCH_CHECK, or a LOCKSTEP_CHECK of a foreign class
//   fails, naming the file and the line.
// - Every option a user sets is read by some code (an option nothing reads does nothing).
// - No file under src/ or include/ is over 600 lines, and no function body there over 60; each
//   offender is named with its length.
// - Only include/lockstep/core/libtorch_compat.h tests the LibTorch version (TORCH_VERSION_*):
//   every difference between LibTorch 1.x and 2.x is answered there, once.
// And one check without a synthetic tree: every TrainerOptions and PlanOptions field takes its
// LOCKSTEP_TRAINER_* variable (deleting a line of apply_trainer_variables fails it).
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
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

const std::vector<std::string> kBases = {"include/lockstep", "src/lockstep"};

// Inside distributed/: the process group and collectives (its own files), then comm/ (the
// transports both engines stand on), then ddp/ and fsdp/, which do not include each other.
const std::map<std::string, int> kDistributedLayers = {{"", 0}, {"comm", 1}, {"ddp", 2}, {"fsdp", 2}};

// "distributed/comm/hosts.h" -> "comm"; "distributed/collectives.h" -> "".
std::string subfolder_of(const std::string& below_lockstep) {
  const auto first = below_lockstep.find('/');
  const auto second = below_lockstep.find('/', first + 1);
  return second == std::string::npos ? "" : below_lockstep.substr(first + 1, second - first - 1);
}

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
      if (!to) continue;
      const std::string where = file.shown + ":" + std::to_string(number) + ": ";
      const std::string what = to->second + (spelled.empty() ? "" : " through \"" + spelled + "\"");
      if (to->first == file.folder) {
        if (file.folder != "distributed") continue;
        const auto from_sub = subfolder_of(lockstep_folder(root, fs::absolute(file.path).lexically_normal())->second);
        const auto to_sub = subfolder_of(to->second);
        if (from_sub == to_sub) continue;
        if (!kDistributedLayers.count(from_sub) || !kDistributedLayers.count(to_sub)) {
          violations.push_back(where + "distributed/" + (kDistributedLayers.count(from_sub) ? to_sub : from_sub) +
                               " has no place in kDistributedLayers");
        } else if (kDistributedLayers.at(to_sub) >= kDistributedLayers.at(from_sub)) {
          violations.push_back(where + "distributed/" + from_sub + " includes " + what +
                               (kDistributedLayers.at(to_sub) == kDistributedLayers.at(from_sub) ? " (same layer)"
                                                                                                : " (a higher layer)"));
        }
        continue;
      }
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
  // Inside distributed/: comm below ddp and fsdp, which are peers.
  write(root / "src/lockstep/distributed/comm/hosts.cpp", "#include <lockstep/distributed/ddp/ddp.h>\n");
  write(root / "src/lockstep/distributed/fsdp/unit.cpp",
        "#include <lockstep/distributed/comm/shard_transport.h>\n#include \"../ddp/reducer_internal.h\"\n");
  write(root / "src/lockstep/distributed/ddp/reducer_internal.h", "#pragma once\n");
  write(root / "src/lockstep/distributed/collectives.cpp", "#include \"comm/hosts.h\"\n");

  const auto violations = layering_violations(root);
  const std::string all = joined(violations);
  ASSERT_EQ(violations.size(), 8u) << all;
  EXPECT_NE(all.find("src/lockstep/distributed/comm/hosts.cpp:1: distributed/comm includes distributed/ddp/ddp.h "
                     "(a higher layer)"),
            std::string::npos) << all;
  EXPECT_NE(all.find("src/lockstep/distributed/fsdp/unit.cpp:2: distributed/fsdp includes "
                     "distributed/ddp/reducer_internal.h through \"../ddp/reducer_internal.h\" (same layer)"),
            std::string::npos) << all;
  EXPECT_NE(all.find("src/lockstep/distributed/collectives.cpp:1: distributed/ includes distributed/comm/hosts.h "
                     "through \"comm/hosts.h\" (a higher layer)"),
            std::string::npos) << all;
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

// --- One error model -----------------------------------------------------------------------------

// Foreign exceptions that are thrown on purpose but never leave Lockstep, each with the reason.
const std::map<std::string, std::string> kForeignThrowsAllowed = {
    {"CLI::ValidationError", "thrown inside a flag's callback; app.parse reports it (cli/trainer_flags.cpp)"},
};

// Exceptions of the standard library and LibTorch that must not be built to be thrown.
const std::regex kForeignException(
    R"(((?:std|::std)::(?:runtime_error|logic_error|out_of_range|invalid_argument|domain_error|length_error|)"
    R"(range_error|overflow_error|underflow_error|system_error|exception|filesystem::filesystem_error)|)"
    R"((?:c10|torch|at)::\w*Error)\s*[({])");
// LibTorch's macros that throw c10::Error.
const std::regex kTorchCheck(R"((TORCH_CHECK\w*|TORCH_INTERNAL_ASSERT\w*|AT_ERROR|AT_ASSERT\w*|C10_THROW_ERROR)\s*\()");

bool is_identifier_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// The text of a source file with its comments blanked and its string and character literals
// emptied ("" and ''), line breaks kept, so that a `throw` in a comment or a message is not code.
std::string code_of(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  std::string code;
  code.reserve(text.size());
  auto blank = [&](size_t from, size_t to) {  // keeps the line breaks of [from, to)
    for (size_t k = from; k < std::min(to, text.size()); ++k) code += text[k] == '\n' ? '\n' : ' ';
  };
  auto past = [&](size_t found, size_t length) { return found == std::string::npos ? text.size() : found + length; };
  for (size_t i = 0; i < text.size();) {
    const char c = text[i];
    const char next = i + 1 < text.size() ? text[i + 1] : '\0';
    const char before = i > 0 ? text[i - 1] : '\0';
    if (c == '/' && next == '/') {
      i = std::min(text.size(), text.find('\n', i));
    } else if (c == '/' && next == '*') {
      const size_t end = past(text.find("*/", i + 2), 2);
      blank(i, end);
      i = end;
    } else if (c == '"' && before == 'R' && (i < 2 || !is_identifier_char(text[i - 2]) ||
                                             std::string("8uUL").find(text[i - 2]) != std::string::npos)) {
      const size_t open = text.find('(', i);  // R"delim( ... )delim"
      const size_t end = open == std::string::npos
                             ? text.size()
                             : past(text.find(")" + text.substr(i + 1, open - i - 1) + "\"", open), open - i + 1);
      code += "\"\"";
      blank(i, end);
      i = end;
    } else if (c == '"' || (c == '\'' && !std::isdigit(static_cast<unsigned char>(before)))) {  // not 1'000
      size_t end = i + 1;
      while (end < text.size() && text[end] != c && text[end] != '\n') end += text[end] == '\\' ? 2 : 1;
      code += std::string(2, c);
      i = end + 1;
    } else {
      code += c;
      ++i;
    }
  }
  return code;
}

// Lines of `code`, with the definition of LOCKSTEP_CHECK blanked: its `throw ErrorType(` names a
// macro parameter, and every use of the macro is checked instead.
std::vector<std::string> lines_of(const std::string& code) {
  std::vector<std::string> lines;
  std::istringstream in(code);
  std::string line;
  bool in_check_definition = false;
  while (std::getline(in, line)) {
    static const std::regex check_definition(R"(^\s*#\s*define\s+LOCKSTEP_CHECK\b)");
    if (std::regex_search(line, check_definition)) in_check_definition = true;
    const bool continues = !line.empty() && line.back() == '\\';
    lines.push_back(in_check_definition ? "" : line);
    if (!continues) in_check_definition = false;
  }
  return lines;
}

// Namespaces a Lockstep class may be named through: lockstep, its folders, detail.
bool lockstep_qualifier(const std::string& qualifier) {
  static const std::set<std::string> names = [] {
    std::set<std::string> all{"", "lockstep", "detail"};
    for (const auto& layer : kLayers) all.insert(layer.begin(), layer.end());
    return all;
  }();
  std::stringstream parts(qualifier);
  std::string part;
  while (std::getline(parts, part, ':')) {
    if (!names.count(part)) return false;
  }
  return true;
}

// "distributed::DistributedError" -> {"distributed::", "DistributedError"}.
std::pair<std::string, std::string> split_name(const std::string& name) {
  const size_t last = name.rfind("::");
  if (last == std::string::npos) return {"", name};
  return {name.substr(0, last + 2), name.substr(last + 2)};
}

struct ErrorModel {
  std::set<std::string> classes;    // lockstep::Error and every class derived from it
  std::set<std::string> factories;  // functions that return one of them (`EnvironmentError malformed(...)`)
};

ErrorModel error_model(const std::vector<std::vector<std::string>>& files) {
  static const std::regex derived(R"(\b(?:class|struct)\s+(\w+)\s*(?:final\s*)?:\s*(?:public\s+)?((?:::)?[\w:]+))");
  static const std::regex factory(
      R"(^\s*(?:\[\[noreturn\]\]\s*)?(?:(?:static|inline)\s+)*((?:::)?[\w:]+)\s+(\w+)\s*\()");
  ErrorModel model;
  model.classes.insert("Error");
  for (bool grew = true; grew;) {
    grew = false;
    for (const auto& lines : files) {
      for (const auto& line : lines) {
        std::smatch match;
        if (!std::regex_search(line, match, derived)) continue;
        const auto [qualifier, base] = split_name(match[2]);
        if (lockstep_qualifier(qualifier) && model.classes.count(base) && model.classes.insert(match[1]).second) {
          grew = true;
        }
      }
    }
  }
  for (const auto& lines : files) {
    for (const auto& line : lines) {
      std::smatch match;
      if (!std::regex_search(line, match, factory)) continue;
      const auto [qualifier, returned] = split_name(match[1]);
      if (lockstep_qualifier(qualifier) && model.classes.count(returned)) model.factories.insert(match[2]);
    }
  }
  return model;
}

// The second argument of the LOCKSTEP_CHECK call whose '(' is at `open` in `text`.
std::string second_argument(const std::string& text, size_t open) {
  int depth = 0;
  size_t start = std::string::npos;
  for (size_t i = open; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '(' || c == '[' || c == '{') ++depth;
    if (c == ')' || c == ']' || c == '}') --depth;
    if (depth == 0) break;
    if (depth == 1 && c == ',') {
      if (start != std::string::npos) {
        std::string argument = text.substr(start, i - start);
        argument.erase(0, argument.find_first_not_of(" \t\n"));
        argument.erase(argument.find_last_not_of(" \t\n") + 1);
        return argument;
      }
      start = i + 1;
    }
  }
  return "";
}

// Whether the name at `at` follows `public`, `protected`, `private` or `virtual`: a base class.
bool base_specifier(const std::string& line, size_t at) {
  static const std::regex access(R"((?:^|\W)(?:public|protected|private|virtual)\s+$)");
  return std::regex_search(line.substr(0, at), access);
}

bool allowed_class(const ErrorModel& model, const std::string& name) {
  const auto [qualifier, last] = split_name(name);
  return lockstep_qualifier(qualifier) && model.classes.count(last) > 0;
}

// Offenders in file order: "src/lockstep/data/x.cpp:12: throws std::out_of_range, not a lockstep::Error; ...".
std::vector<std::string> foreign_throws(const fs::path& root) {
  static const std::regex thrown(R"(\s*((?:::)?[A-Za-z_][\w:]*)\s*[({])");
  static const std::regex check_call(R"(LOCKSTEP_CHECK\s*\()");
  constexpr auto at_start = std::regex_constants::match_continuous;
  const auto files = source_files(root);
  std::vector<std::vector<std::string>> lines;
  for (const auto& file : files) lines.push_back(lines_of(code_of(file.path)));
  const ErrorModel model = error_model(lines);
  const std::string fix = "; throw a lockstep::Error of the right kind (UsageError, IoError, DistributedError, ...)";
  std::vector<std::string> offenders;
  for (size_t f = 0; f < files.size(); ++f) {
    const auto& file_lines = lines[f];
    const bool error_header = files[f].shown == "include/lockstep/core/error.h";
    std::set<std::pair<size_t, size_t>> thrown_names;  // (line, column) of names a `throw` was judged by
    for (size_t n = 0; n < file_lines.size(); ++n) {
      const std::string& line = file_lines[n];
      const std::string where = files[f].shown + ":" + std::to_string(n + 1) + ": ";
      for (size_t at = 0; at < line.size(); ++at) {
        if (!is_identifier_char(line[at]) && line[at] != ':') continue;
        if (at > 0 && (is_identifier_char(line[at - 1]) || line[at - 1] == ':')) continue;
        if (thrown_names.count({n, at})) continue;
        const auto rest_begin = line.begin() + static_cast<std::ptrdiff_t>(at);
        std::smatch match;
        if (line.compare(at, 5, "throw") == 0 && (at + 5 == line.size() || !is_identifier_char(line[at + 5]))) {
          size_t k = n, column = at + 5;  // the thrown expression, on the next line when `throw` ends this one
          while (file_lines[k].find_first_not_of(" \t", column) == std::string::npos && k + 1 < file_lines.size()) {
            ++k;
            column = 0;
          }
          const std::string& text = file_lines[k];
          const size_t first = text.find_first_not_of(" \t", column);
          if (first != std::string::npos && text[first] == ';') continue;  // rethrow
          if (!std::regex_search(text.begin() + static_cast<std::ptrdiff_t>(column), text.end(), match, thrown,
                                 at_start)) {
            offenders.push_back(where + "throws `" + text.substr(column, 40) + "`, not a lockstep::Error" + fix);
            continue;
          }
          thrown_names.insert({k, column + static_cast<size_t>(match.position(1))});
          const std::string name = match[1];
          if (allowed_class(model, name) || model.factories.count(name) || kForeignThrowsAllowed.count(name)) continue;
          offenders.push_back(where + "throws " + name + ", not a lockstep::Error" + fix);
        } else if (std::regex_search(rest_begin, line.end(), match, kForeignException, at_start)) {
          if (base_specifier(line, at)) continue;  // a class derived from it: its throws are judged
          // lockstep::Error's own base, in its constructor's initializer list.
          const size_t before = at == 0 ? std::string::npos : line.find_last_not_of(" \t", at - 1);
          if (error_header && before != std::string::npos && line[before] == ':') continue;
          offenders.push_back(where + "builds a " + match[1].str() + ", not a lockstep::Error" + fix);
        } else if (std::regex_search(rest_begin, line.end(), match, kTorchCheck, at_start)) {
          offenders.push_back(where + match[1].str() +
                              " throws c10::Error; use LOCKSTEP_CHECK with a lockstep::Error class");
        } else if (std::regex_search(rest_begin, line.end(), match, check_call, at_start)) {
          std::string call;  // the arguments may go on over the next lines
          for (size_t k = n; k < file_lines.size() && k < n + 10; ++k) call += file_lines[k] + "\n";
          const std::string type = second_argument(call, at + static_cast<size_t>(match.length(0)) - 1);
          if (!allowed_class(model, type)) {
            offenders.push_back(where + "LOCKSTEP_CHECK throws " + type + ", not a lockstep::Error" + fix);
          }
        }
      }
    }
  }
  return offenders;
}

TEST(Architecture, EveryDeliberateThrowIsALockstepError) {
  const auto offenders = foreign_throws(LOCKSTEP_SOURCE_DIR);
  for (const auto& offender : offenders) ADD_FAILURE() << offender;
  EXPECT_TRUE(offenders.empty());
}

// The scan finds lockstep::Error's classes and the functions returning them wherever they are
// declared, passes rethrows, comments and messages, and names each other throw.
TEST(Architecture, AThrowOfAForeignExceptionIsNamed) {
  testing::TempDir dir("lockstep_throws");
  const fs::path root = dir.path();
  write(root / "include/lockstep/core/error.h",
        "class Error : public std::runtime_error {\n"
        "  Error(const std::string& message)\n"
        "      : std::runtime_error(message) {}\n"
        "};\n"
        "class UsageError : public Error {};\n"
        "#define LOCKSTEP_CHECK(condition, ErrorType, ...) \\\n"
        "  if (!(condition)) throw ErrorType(concat(__VA_ARGS__))\n");
  write(root / "include/lockstep/distributed/distributed_error.h",
        "class DistributedError : public lockstep::Error {};\n"
        "class UnusedParametersError final : public DistributedError {};\n");
  write(root / "src/lockstep/distributed/join.cpp",
        "DistributedError early_termination(int rank) { return DistributedError(\"x\"); }\n"
        "void f() { throw early_termination(1); }\n"
        "void g() {\n"
        "  try { f(); } catch (...) { throw; }\n"
        "  // throw std::runtime_error(\"in a comment\");\n"
        "  const char* s = \"throw std::logic_error(\";\n"
        "  /* throw c10::Error(...) */ throw distributed::UnusedParametersError(\"x\", {});\n"
        "  LOCKSTEP_CHECK(s != nullptr, distributed::DistributedError, \"fine\");\n"
        "  bool throw_on_early_termination = true;\n"
        "}\n");
  write(root / "src/lockstep/data/loader.cpp",
        "class NotAnError : public std::exception {};\n"
        "void a() { throw std::out_of_range(\"batch 3 of 2\"); }\n"
        "void b() {\n"
        "  throw\n"
        "      c10::Error({__func__, __FILE__, 1}, \"x\");\n"
        "  auto e = std::runtime_error(\"kept\");\n"
        "  TORCH_CHECK(false, \"x\");\n"
        "  LOCKSTEP_CHECK(f(1, 2) > 0, std::invalid_argument, \"x\");\n"
        "  LOCKSTEP_CHECK(true,\n"
        "                 UsageError, \"fine\");\n"
        "  throw NotAnError();\n"
        "  throw c10::UsageError(\"not ours, though named like one\");\n"
        "}\n");

  const auto offenders = foreign_throws(root);
  const std::string all = joined(offenders);
  const std::vector<std::string> expected = {
      "src/lockstep/data/loader.cpp:2: throws std::out_of_range, not a lockstep::Error",
      "src/lockstep/data/loader.cpp:4: throws c10::Error, not a lockstep::Error",
      "src/lockstep/data/loader.cpp:6: builds a std::runtime_error, not a lockstep::Error",
      "src/lockstep/data/loader.cpp:7: TORCH_CHECK throws c10::Error",
      "src/lockstep/data/loader.cpp:8: LOCKSTEP_CHECK throws std::invalid_argument, not a lockstep::Error",
      "src/lockstep/data/loader.cpp:11: throws NotAnError, not a lockstep::Error",
      "src/lockstep/data/loader.cpp:12: throws c10::UsageError, not a lockstep::Error",
  };
  ASSERT_EQ(offenders.size(), expected.size()) << all;
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(offenders[i].rfind(expected[i], 0), 0u) << "offender " << i << ": " << offenders[i];
  }
}

// --- One LibTorch-version seam ---------------------------------------------------------------------

// The header that answers every difference between LibTorch 1.x and 2.x.
const std::string kLibTorchSeam = "include/lockstep/core/libtorch_compat.h";

// Files that may name a version macro without testing it, each with the reason.
const std::map<std::string, std::string> kVersionMacroAllowed = {
    {"src/lockstep/cli/trainer_flags.cpp", "prints TORCH_VERSION, the version string, for --version"},
};

// Uses of TORCH_VERSION and TORCH_VERSION_* (MAJOR, MINOR, PATCH) in code (comments and strings
// do not count) outside the seam, one per line: "src/lockstep/plan/precision.cpp:16: uses
// TORCH_VERSION_MAJOR outside include/lockstep/core/libtorch_compat.h; ...".
std::vector<std::string> version_checks_outside_the_seam(const fs::path& root) {
  static const std::regex macro(R"(\bTORCH_VERSION(_\w+)?\b)");
  std::vector<std::string> offenders;
  for (const auto& file : source_files(root)) {
    if (file.shown == kLibTorchSeam || kVersionMacroAllowed.count(file.shown)) continue;
    const auto lines = lines_of(code_of(file.path));
    for (size_t n = 0; n < lines.size(); ++n) {
      std::smatch match;
      if (!std::regex_search(lines[n], match, macro)) continue;
      offenders.push_back(file.shown + ":" + std::to_string(n + 1) + ": uses " + match[0].str() + " outside " +
                          kLibTorchSeam + "; answer the difference between LibTorch 1.x and 2.x there, by a name "
                          "this file uses");
    }
  }
  return offenders;
}

TEST(Architecture, OnlyTheSeamTestsTheLibTorchVersion) {
  const auto offenders = version_checks_outside_the_seam(LOCKSTEP_SOURCE_DIR);
  for (const auto& offender : offenders) ADD_FAILURE() << offender;
  EXPECT_TRUE(offenders.empty());
  EXPECT_TRUE(fs::exists(fs::path(LOCKSTEP_SOURCE_DIR) / kLibTorchSeam)) << kLibTorchSeam;
}

// The check names each line of code that tests the version outside the seam, in a header or a
// source of any folder, and passes the seam itself, the allowed file, comments, strings and
// longer names that merely contain the macro's.
TEST(Architecture, AVersionCheckOutsideTheSeamIsNamed) {
  testing::TempDir dir("lockstep_seam");
  const fs::path root = dir.path();
  write(root / kLibTorchSeam,
        "#if TORCH_VERSION_MAJOR >= 2\nusing Backend = c10d::Backend;\n#endif\n");
  write(root / "src/lockstep/plan/precision.cpp",
        "#include <torch/version.h>\n"
        "#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)\n"
        "bool f() { return true; }\n"
        "#endif\n");
  write(root / "include/lockstep/launchers/worker_environment.h",
        "// TORCH_NCCL_ASYNC_ERROR_HANDLING from TORCH_VERSION_MINOR 2 on\n"
        "const char* name = \"TORCH_VERSION_MAJOR\";\n"
        "constexpr bool kNew = TORCH_VERSION_MAJOR >= 2;\n"
        "constexpr int MY_TORCH_VERSION_MAJOR = 1, TORCH_VERSIONS = 2;\n");
  write(root / "src/lockstep/cli/trainer_flags.cpp", "std::string v = std::string(TORCH_VERSION);\n");
  write(root / "src/lockstep/cli/guarded_main.cpp", "std::string v = TORCH_VERSION;\n");
  write(root / "src/lockstep/distributed/comm/shard_transport.cpp", "#ifdef TORCH_VERSION_PATCH\n#endif\n");

  const auto offenders = version_checks_outside_the_seam(root);
  const std::vector<std::string> expected = {
      "include/lockstep/launchers/worker_environment.h:3: uses TORCH_VERSION_MAJOR outside " + kLibTorchSeam,
      "src/lockstep/cli/guarded_main.cpp:1: uses TORCH_VERSION outside " + kLibTorchSeam,
      "src/lockstep/distributed/comm/shard_transport.cpp:1: uses TORCH_VERSION_PATCH outside " + kLibTorchSeam,
      "src/lockstep/plan/precision.cpp:2: uses TORCH_VERSION_MAJOR outside " + kLibTorchSeam,
  };
  ASSERT_EQ(offenders.size(), expected.size()) << joined(offenders);
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(offenders[i].rfind(expected[i], 0), 0u) << "offender " << i << ": " << offenders[i];
  }
}


// Options nothing reads. Every option a user sets (a TORCH_ARG field under include/lockstep:
// TrainerOptions, FabricOptions through PlanOptions, DDPOptions, ...; a getter of LaunchOptions)
// must be called as `name()` in the code of src/, tools/ or examples/ (comments and strings do not
// count) outside the flag registration (src/lockstep/cli/trainer_flags.cpp, which only writes
// them): an option nothing reads is a promise that does nothing. One line per unread option,
// "include/lockstep/x.h: name() is read by nothing".
std::vector<std::string> unread_options(const fs::path& root) {
  static const std::regex torch_arg(R"(TORCH_ARG\(\s*[^,]+,\s*(\w+)\s*\))");
  static const std::regex launch_getter(R"((\w+)\(\)\s*const\s*\{\s*return\s+\w+_;)");
  std::vector<std::pair<std::string, std::string>> options;  // name, header
  for (const auto& entry : fs::recursive_directory_iterator(root / "include/lockstep")) {
    if (!entry.is_regular_file()) continue;
    const std::string code = code_of(entry.path());
    const std::string shown = fs::relative(entry.path(), root).generic_string();
    for (const auto* pattern : {&torch_arg, &launch_getter}) {
      if (pattern == &launch_getter && entry.path().filename() != "launch_options.h") continue;
      for (std::sregex_iterator it(code.begin(), code.end(), *pattern), end; it != end; ++it) {
        options.emplace_back((*it)[1], shown);
      }
    }
  }
  std::set<std::string> called;  // every `name()` of the readers' code
  for (const char* top : {"src", "tools", "examples"}) {
    if (!fs::exists(root / top)) continue;
    for (const auto& entry : fs::recursive_directory_iterator(root / top)) {
      const auto extension = entry.path().extension();
      if (!entry.is_regular_file() || (extension != ".cpp" && extension != ".h")) continue;
      if (entry.path().filename() == "trainer_flags.cpp") continue;
      const std::string code = code_of(entry.path());
      for (size_t open = code.find('('); open != std::string::npos; open = code.find('(', open + 1)) {
        const size_t close = code.find_first_not_of(" \t\n", open + 1);
        if (close == std::string::npos || code[close] != ')') continue;
        size_t begin = open;
        while (begin > 0 && is_identifier_char(code[begin - 1])) --begin;
        called.insert(code.substr(begin, open - begin));
      }
    }
  }
  std::vector<std::string> unread;
  for (const auto& [name, header] : options) {
    if (!called.count(name)) unread.push_back(header + ": " + name + "() is read by nothing");
  }
  return unread;
}

TEST(Architecture, EveryOptionIsReadBySomething) {
  const auto unread = unread_options(LOCKSTEP_SOURCE_DIR);
  for (const auto& option : unread) ADD_FAILURE() << option << ": make it act (with a test), or remove it";
  EXPECT_TRUE(unread.empty());
}

// The check names an option that only the flag registration and a comment mention, and passes
// one that code reads, a TORCH_ARG field or a LaunchOptions getter.
TEST(Architecture, AnOptionNothingReadsIsNamed) {
  testing::TempDir dir("lockstep_unread");
  const fs::path root = dir.path();
  write(root / "include/lockstep/trainer/trainer_options.h",
        "struct TrainerOptions {\n"
        "  TORCH_ARG(int64_t, max_epochs) = -1;\n"
        "  TORCH_ARG(std::string, promised) = \"x\";\n"
        "};\n");
  write(root / "include/lockstep/launchers/launch_options.h",
        "class LaunchOptions {\n"
        "  int nnodes() const { return nnodes_; }\n"
        "  int forgotten() const { return forgotten_; }\n"
        "};\n");
  write(root / "src/lockstep/cli/trainer_flags.cpp", "void add(O& o) { flag(\"--promised\", o.promised()); }\n");
  write(root / "src/lockstep/trainer/trainer.cpp",
        "int epochs(const O& o) { return o.max_epochs( ); }  // o.promised() is not read here\n"
        "const char* s = \"forgotten()\";\n");
  write(root / "tools/lockstep/launch_command.cpp", "int n(const L& l) { return l.nnodes(); }\n");
  const auto unread = unread_options(root);
  const std::vector<std::string> expected = {
      "include/lockstep/trainer/trainer_options.h: promised() is read by nothing",
      "include/lockstep/launchers/launch_options.h: forgotten() is read by nothing",
  };
  std::vector<std::string> sorted_unread = unread, sorted_expected = expected;
  std::sort(sorted_unread.begin(), sorted_unread.end());
  std::sort(sorted_expected.begin(), sorted_expected.end());
  EXPECT_EQ(sorted_unread, sorted_expected) << joined(unread);
}


// Every field of TrainerOptions and PlanOptions takes its LOCKSTEP_TRAINER_* variable when the
// options are built in code: apply_trainer_variables lists each field by hand (`v.set("name",`),
// so a field added without its line would ignore its variable. trainer_variables itself is the
// switch, not a field with a variable; configure_strategy is a function, which no variable holds
// (the --fsdp-* flags that set it read their variables themselves).
TEST(Architecture, EveryTrainerOptionTakesItsVariable) {
  const fs::path root = LOCKSTEP_SOURCE_DIR;
  static const std::regex torch_arg(R"(TORCH_ARG\(\s*[^,]+,\s*(\w+)\s*\))");
  std::string setters;
  for (const char* source : {"src/lockstep/trainer/trainer_options.cpp", "src/lockstep/plan/trainer_variables.cpp"}) {
    setters += code_of(root / source);
  }
  int fields = 0;
  for (const char* header : {"include/lockstep/trainer/trainer_options.h", "include/lockstep/plan/plan_options.h"}) {
    const std::string code = code_of(root / header);
    for (std::sregex_iterator it(code.begin(), code.end(), torch_arg), end; it != end; ++it, ++fields) {
      const std::string name = (*it)[1];
      if (name == "trainer_variables" || name == "configure_strategy") continue;
      std::string variable = "LOCKSTEP_TRAINER_" + name;
      std::transform(variable.begin(), variable.end(), variable.begin(), [](unsigned char c) { return std::toupper(c); });
      // code_of empties strings, so the field is found by its getter: v.set("", o.name(), d.name() ...
      EXPECT_NE(setters.find("o." + name + "(), d." + name + "()"), std::string::npos)
          << header << ": " << name << " has no line in apply_trainer_variables, so " << variable
          << " would be ignored for options built in code";
    }
  }
  EXPECT_GE(fields, 33);
}

// --- Short files and functions ----------------------------------------------------------------

// A file longer than this is several concepts in one; split it along them (STYLE.md, 2 and 12).
constexpr int kMaxFileLines = 600;
// A function body longer than this is several steps; extract them, each with a name.
constexpr int kMaxFunctionLines = 60;

// Every file under src/ and include/: its path on disk and as shown ("src/lockstep/core/x.cpp").
std::vector<std::pair<fs::path, std::string>> tree_files(const fs::path& root) {
  std::vector<std::pair<fs::path, std::string>> files;
  for (const char* top : {"include", "src"}) {
    if (!fs::exists(root / top)) continue;
    for (const auto& entry : fs::recursive_directory_iterator(root / top)) {
      if (entry.is_regular_file()) files.emplace_back(entry.path(), fs::relative(entry.path(), root).generic_string());
    }
  }
  std::sort(files.begin(), files.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  return files;
}

// One line per file over `limit` lines: "src/lockstep/x.cpp: 960 lines, over 600; split it ...".
std::vector<std::string> long_files(const fs::path& root, int limit) {
  std::vector<std::string> offenders;
  for (const auto& [path, shown] : tree_files(root)) {
    std::ifstream in(path);
    int lines = 0;
    for (std::string line; std::getline(in, line);) ++lines;
    if (lines <= limit) continue;
    offenders.push_back(shown + ": " + std::to_string(lines) + " lines, over " + std::to_string(limit) +
                        "; split it into files of one concept each");
  }
  return offenders;
}

TEST(Architecture, NoSourceFileIsOver600Lines) {
  const auto offenders = long_files(LOCKSTEP_SOURCE_DIR, kMaxFileLines);
  for (const auto& offender : offenders) ADD_FAILURE() << offender;
  EXPECT_TRUE(offenders.empty());
}

// The check names each file over the limit with its line count, and passes one at the limit,
// under src/ and include/ alike (not only their lockstep/ folders).
TEST(Architecture, AFileOverTheLimitIsNamed) {
  testing::TempDir dir("lockstep_long_files");
  const fs::path root = dir.path();
  const auto lines = [](int n) {
    std::string text;
    for (int i = 0; i < n; ++i) text += "int x" + std::to_string(i) + " = 0;\n";
    return text;
  };
  write(root / "src/lockstep/core/at_the_limit.cpp", lines(20));
  write(root / "src/lockstep/core/long.cpp", lines(21));
  write(root / "include/lockstep/data/long.h", lines(35) + "int unterminated = 0;");
  write(root / "src/other/long.cpp", lines(40));
  write(root / "tools/long.cpp", lines(100));  // outside src/ and include/
  EXPECT_EQ(long_files(root, 20), (std::vector<std::string>{
                                      "include/lockstep/data/long.h: 36 lines, over 20; split it into files of one "
                                      "concept each",
                                      "src/lockstep/core/long.cpp: 21 lines, over 20; split it into files of one "
                                      "concept each",
                                      "src/other/long.cpp: 40 lines, over 20; split it into files of one concept each",
                                  }));
}

// A function body found by scanning the code (code_of: no comments, empty literals) for braces.
struct FunctionBody {
  std::string name;  // "Trainer::restore", "operator()"
  int line = 0;      // of its '{'
  int lines = 0;     // from its '{' to its '}', both counted
};

// What a '{' at namespace or class level opens, told by the text before it there (its head).
enum class Opens { scope, function, constructor, other };

// The index of the ')' that closes the '(' at `open`, or npos.
size_t closing_paren(const std::string& text, size_t open) {
  int depth = 0;
  for (size_t i = open; i < text.size(); ++i) {
    depth += text[i] == '(' ? 1 : text[i] == ')' ? -1 : 0;
    if (depth == 0) return i;
  }
  return std::string::npos;
}

// The head without what may lead it: access specifiers, `template <...>`, attributes, alignas.
std::string head_proper(std::string head) {
  static const std::regex lead(R"(^\s*(?:(?:public|protected|private)\s*:(?!:)|\[\[[^\]]*\]\]|alignas\s*\([^)]*\)))");
  for (std::smatch match; std::regex_search(head, match, lead);) head.erase(0, static_cast<size_t>(match.length(0)));
  head.erase(0, head.find_first_not_of(" \t\n"));
  if (head.rfind("template", 0) == 0 && head.find('<') != std::string::npos) {
    int angles = 0, parens = 0;  // a '>' in parentheses compares: enable_if_t<(sizeof...(T) > 1)>
    for (size_t i = head.find('<'); i < head.size(); ++i) {
      parens += head[i] == '(' ? 1 : head[i] == ')' ? -1 : 0;
      if (parens == 0) angles += head[i] == '<' ? 1 : head[i] == '>' ? -1 : 0;
      if (angles == 0) return head_proper(head.substr(i + 1));
    }
  }
  return head;
}

// The first '(' of `head` that opens a parameter list: after a name, not decltype's or noexcept's.
size_t parameters_open(const std::string& head) {
  static const std::regex not_a_name(R"((?:^|\W)(?:decltype|alignas|noexcept|sizeof)\s*$)");
  for (size_t open = head.find('('); open != std::string::npos; open = head.find('(', open + 1)) {
    if (!std::regex_search(head.substr(0, open), not_a_name)) return open;
    open = closing_paren(head, open);
    if (open == std::string::npos) return open;
  }
  return std::string::npos;
}

// What the head of a '{' at namespace or class level makes it open; `name` is set for a function.
// A namespace, extern "C" or class is a scope (functions are looked for in it); a function or
// constructor has a parameter list followed by qualifiers only, or by a member-initializer list;
// anything else (an enum, an initializer `= {`, a lambda in one, a brace-initialized variable)
// is neither, and the braces in it are not looked into.
Opens classify_head(const std::string& raw, std::string& name) {
  static const std::regex scope(R"(^(?:inline\s+)?namespace\b|^extern\s*""\s*$)");
  static const std::regex class_key(R"(^(?:class|struct|union)\b)");
  static const std::regex function_tail(
      R"(^\s*(?:(?:const|volatile|noexcept(?:\s*\([^()]*\))?|override|final|mutable|&&?)\s*)*(?:->[^{}=;]*)?$)");
  static const std::regex constructor_tail(R"(^\s*(?:noexcept(?:\s*\([^()]*\))?\s*)?:(?!:))");
  static const std::regex operator_name(R"(((?:[\w~<>]+::)*operator\b.*?)\s*$)");
  static const std::regex plain_name(R"(([\w~:<>]+)\s*$)");
  static const std::regex operator_word(R"(\boperator\b)");
  static const std::regex call_operator(R"(operator\s*$)");
  static const std::regex qualifier("::");
  const std::string head = head_proper(raw);
  if (std::regex_search(head, scope)) return Opens::scope;
  size_t open = parameters_open(head);
  if (std::regex_search(head, class_key)) {
    const size_t colon = std::regex_replace(head, qualifier, "##").find(':');
    if (open == std::string::npos || colon < open) return Opens::scope;
  }
  if (open == std::string::npos) return Opens::other;
  std::string before = head.substr(0, open);
  const bool is_operator = std::regex_search(before, operator_word);
  if (!is_operator && before.find('=') != std::string::npos) return Opens::other;
  if (is_operator && head.compare(open, 2, "()") == 0 && std::regex_search(before, call_operator)) {
    open = head.find('(', open + 2);  // operator()(...)
    if (open == std::string::npos) return Opens::other;
    before = head.substr(0, open);
  }
  const size_t close = closing_paren(head, open);
  if (close == std::string::npos) return Opens::other;
  std::smatch match;
  if (!std::regex_search(before, match, is_operator ? operator_name : plain_name)) return Opens::other;
  name = match[1];
  const std::string tail = head.substr(close + 1);
  if (std::regex_match(tail, function_tail)) return Opens::function;
  if (std::regex_search(tail, constructor_tail)) return Opens::constructor;
  return Opens::other;
}

// `code` with its preprocessor lines (and their continuations) blanked, line breaks kept.
std::string without_preprocessor_lines(const std::string& code) {
  std::string kept;
  std::istringstream in(code);
  bool continued = false;
  for (std::string line; std::getline(in, line);) {
    const size_t first = line.find_first_not_of(" \t");
    const bool directive = continued || (first != std::string::npos && line[first] == '#');
    continued = directive && !line.empty() && line.back() == '\\';
    kept += (directive ? "" : line) + "\n";
  }
  return kept;
}

struct OpenBrace {
  Opens what = Opens::other;
  bool in_head = false;  // braces before a body: a default argument `= {}`, a member initializer `x_{0}`
  FunctionBody body;
};

// What a '{' at namespace or class level, on `line` after `head`, opens.
OpenBrace brace_after(const std::string& head, int line) {
  FunctionBody body{"", line, 0};
  const Opens what = classify_head(head, body.name);
  const size_t last = head.find_last_not_of(" \t\n");
  const bool in_parentheses = std::count(head.begin(), head.end(), '(') > std::count(head.begin(), head.end(), ')');
  const bool member_init = what == Opens::constructor && last != std::string::npos &&
                           (is_identifier_char(head[last]) || head[last] == '>');  // `x_{0}`, `Base<T>{...}`
  if (in_parentheses || member_init) return {Opens::other, true, {}};
  return {what == Opens::constructor ? Opens::function : what, false, body};
}

// The function bodies defined at namespace or class level in `code` (code_of's text), in order.
// Braces inside a body (control blocks, lambdas, local classes) are the body's own; preprocessor
// lines are skipped. False when the braces do not balance (an #if whose branches open differently).
bool function_bodies(const std::string& code_given, std::vector<FunctionBody>& bodies) {
  const std::string code = without_preprocessor_lines(code_given);
  std::vector<OpenBrace> open;
  std::string head;  // the text at the current namespace or class level since its last ';', '{' or '}'
  int line = 1;
  for (const char c : code) {
    const bool at_scope_level = open.empty() || open.back().what == Opens::scope;
    if (c == '\n') ++line;
    if (c == '{') {
      open.push_back(at_scope_level ? brace_after(head, line) : OpenBrace{});
      if (at_scope_level && !open.back().in_head) head.clear();
    } else if (c == '}') {
      if (open.empty()) return false;
      const OpenBrace closed = open.back();
      open.pop_back();
      if (closed.what == Opens::function) {
        bodies.push_back({closed.body.name, closed.body.line, line - closed.body.line + 1});
      }
      if (!open.empty() && open.back().what != Opens::scope) continue;
      if (closed.in_head) {
        head += "{}";
      } else {
        head.clear();
      }
    } else if (at_scope_level && c == ';') {
      head.clear();
    } else if (at_scope_level) {
      head += c;
    }
  }
  return open.empty();
}

// One line per function body over `limit` lines, in file order:
// "src/lockstep/trainer/loops.cpp:114: Trainer::run_training_epoch is 87 lines, over 60; ...".
std::vector<std::string> long_functions(const fs::path& root, int limit) {
  std::vector<std::string> offenders;
  for (const auto& [path, shown] : tree_files(root)) {
    if (path.extension() != ".cpp" && path.extension() != ".h") continue;
    std::vector<FunctionBody> bodies;
    if (!function_bodies(code_of(path), bodies)) {
      offenders.push_back(shown + ": its braces do not balance outside comments and literals (an #if whose "
                          "branches open different blocks?), so its functions cannot be measured; open and close "
                          "each block in every branch");
      continue;
    }
    for (const auto& body : bodies) {
      if (body.lines <= limit) continue;
      offenders.push_back(shown + ":" + std::to_string(body.line) + ": " + body.name + " is " +
                          std::to_string(body.lines) + " lines, over " + std::to_string(limit) +
                          "; extract its steps into functions with names");
    }
  }
  return offenders;
}

TEST(Architecture, NoFunctionIsOver60Lines) {
  const auto offenders = long_functions(LOCKSTEP_SOURCE_DIR, kMaxFunctionLines);
  for (const auto& offender : offenders) ADD_FAILURE() << offender;
  EXPECT_TRUE(offenders.empty());
}

// The synthetic tree of AFunctionOverTheLimitIsNamed: for a limit of 10, three functions over it
// among ones at it and braces that open no function, and a file whose braces do not balance.
void write_functions_tree(const fs::path& root) {
  const auto statements = [](int n) {
    std::string text;
    for (int i = 0; i < n; ++i) text += "  x += " + std::to_string(i) + ";\n";
    return text;
  };
  // Each body below is 2 lines ('{' and '}') plus its statements; the limit is 10.
  write(root / "src/lockstep/core/functions.cpp",
        "#include <x.h>\n"                                                             // 1
        "namespace lockstep {\n"                                                       // 2
        "namespace {\n"                                                                // 3
        "int at_the_limit(int x) {\n" + statements(8) + "}\n" +                        // 4-13
        "}  // namespace\n"                                                            // 14
        "std::vector<int> Trainer::too_long(const std::map<int, int>& m) const {\n"     // 15
        "  if (x) {\n    const char* s = \"}}}\";\n    char c = '}';\n  }\n"          // 16-19
        "  auto f = [&](int y) {\n    return y; // }\n  };\n" +                       // 20-22
        statements(3) + "}\n" +                                                        // 23-26
        "const auto kTable = [] {\n" + statements(12) + "}();\n" +                     // 27-40
        "enum class Kind {\n" + std::string(12, '\n') + "};\n" +                       // 41-54
        "Runner::Runner(int a)\n    : a_(a),\n      b_{a, 2},\n      c_(std::vector<int>{1}) {\n" +  // 55-58
        statements(9) + "}\n" +                                                        // 59-68
        "#define BODY { x += 1; }\n"                                                   // 69
        "/* void commented() { */\n"                                                   // 70
        "}  // namespace lockstep\n");                                                 // 71
  write(root / "include/lockstep/core/runner.h",
        "#pragma once\n"                                                               // 1
        "template <typename T>\n"                                                      // 2
        "class Runner : public Base<T> {\n"                                            // 3
        " public:\n"                                                                   // 4
        "  int operator()(int x) const {\n" + statements(9) + "  }\n" +                // 5-15
        "  bool operator<(const Runner& other) const { return a_ < other.a_; }\n" +    // 16
        "  std::function<void()> callback_ = [] {\n" + statements(12) + "  };\n" +     // 17-30
        "  int a_{0};\n"                                                               // 31
        "};\n");                                                                       // 32
  write(root / "include/lockstep/core/templates.h",
        "template <typename T, std::enable_if_t<(sizeof(T) > 1), int> = 0>\n"           // 1
        "decltype(auto) forward_all(T&& value, Options options = {}) {\n" +            // 2
        statements(9) + "}\n" +                                                        // 3-12
        "auto make(int depth = 0, std::string bytes = {}) -> decltype(bytes) { return bytes; }\n");  // 13
  write(root / "src/lockstep/core/unbalanced.cpp",
        "void f() {\n#if A\n  if (a) {\n#else\n  if (b) {\n#endif\n  }\n}\n");
  write(root / "src/lockstep/core/notes.txt", "void f() {\n" + statements(20) + "}\n");
}

// The check measures functions and member functions (defined in their class or out of it,
// constructors with member-initializer lists, operators, templates, decltype(auto), `= {}`
// default arguments) from '{' to '}'. It takes for a function no lambda or initializer at
// namespace level, no enum, no control block or lambda inside a function (they are its lines), and
// no braces in comments, strings, character literals or preprocessor lines. A file whose braces do
// not balance is named.
TEST(Architecture, AFunctionOverTheLimitIsNamed) {
  testing::TempDir dir("lockstep_long_functions");
  const fs::path root = dir.path();
  write_functions_tree(root);
  const std::string fix = "; extract its steps into functions with names";
  const std::vector<std::string> expected = {
      "include/lockstep/core/runner.h:5: operator() is 11 lines, over 10" + fix,
      "include/lockstep/core/templates.h:2: forward_all is 11 lines, over 10" + fix,
      "src/lockstep/core/functions.cpp:15: Trainer::too_long is 12 lines, over 10" + fix,
      "src/lockstep/core/functions.cpp:58: Runner::Runner is 11 lines, over 10" + fix,
      "src/lockstep/core/unbalanced.cpp: its braces do not balance outside comments and literals (an #if whose "
      "branches open different blocks?), so its functions cannot be measured; open and close each block in every "
      "branch",
  };
  const auto offenders = long_functions(root, 10);
  EXPECT_EQ(offenders, expected) << joined(offenders);
  std::vector<FunctionBody> bodies;
  ASSERT_TRUE(function_bodies(code_of(root / "src/lockstep/core/functions.cpp"), bodies));
  std::vector<std::string> measured;
  for (const auto& body : bodies) measured.push_back(body.name + ":" + std::to_string(body.line) + ":" +
                                                     std::to_string(body.lines));
  EXPECT_EQ(measured, (std::vector<std::string>{"at_the_limit:4:10", "Trainer::too_long:15:12", "Runner::Runner:58:11"}));
  bodies.clear();
  ASSERT_TRUE(function_bodies(code_of(root / "include/lockstep/core/templates.h"), bodies));
  ASSERT_EQ(bodies.size(), 2u);
  EXPECT_EQ(bodies[1].name + ":" + std::to_string(bodies[1].line) + ":" + std::to_string(bodies[1].lines), "make:13:1");
}

// `#include <lockstep/lockstep.h>` brings in every public name: it names every header of
// include/lockstep (the user guide's snippets, DocsCompile, include it alone).
TEST(Architecture, LockstepHIncludesEveryPublicHeader) {
  const fs::path include = fs::path(LOCKSTEP_SOURCE_DIR) / "include";
  std::ifstream in(include / "lockstep" / "lockstep.h");
  const std::string umbrella((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  int headers = 0;
  for (const auto& entry : fs::recursive_directory_iterator(include / "lockstep")) {
    const auto name = fs::relative(entry.path(), include).generic_string();
    if (entry.path().extension() != ".h" || name == "lockstep/lockstep.h") continue;
    ++headers;
    EXPECT_NE(umbrella.find("#include <" + name + ">"), std::string::npos) << "lockstep.h does not include " << name;
  }
  EXPECT_GE(headers, 100);
}

}  // namespace
}  // namespace lockstep
