#include "yaml_config.h"

#include <algorithm>
#include <memory>
#include <set>

#include <yaml-cpp/yaml.h>

#include <lockstep/core/error.h>

namespace lockstep {
namespace cli {
namespace detail {
namespace {

const std::string kTrainer = "trainer", kModel = "model";
constexpr size_t kMaxConfigBytes = size_t{1} << 20;

// "--max-epochs" -> "max_epochs", as LightningCLI spells Trainer arguments.
std::string key_of(const CLI::Option* option) {
  std::string key = option->get_lnames().front();
  std::replace(key.begin(), key.end(), '-', '_');
  return key;
}

std::string flag_of(std::string key) {
  std::replace(key.begin(), key.end(), '_', '-');
  return "--" + key;
}

// What Lightning users put at the top of a LightningCLI config, and where it goes here.
std::string top_level_fix(const std::string& key) {
  if (key == "data") return "The program's data flags (--batch-size, --data-dir, ...) are its own: put them under model:.";
  if (key == "seed_everything") return "Put the seed under trainer: as seed: N (the --seed flag).";
  if (key == "ckpt_path") return "Put it under trainer: as ckpt_path: PATH (the --ckpt-path flag).";
  if (key == "optimizer" || key == "lr_scheduler") {
    return "Optimizers come from configure_optimizers; the program's flags for them (--lr, ...) go under model:.";
  }
  return "A config has two sections: trainer: (the Trainer's flags) and model: (the program's own flags).";
}

class YamlConfig : public CLI::Config {
 public:
  explicit YamlConfig(const CLI::App& app) : app_(app) {}

  std::vector<CLI::ConfigItem> from_config(std::istream& input) const override;
  std::string to_config(const CLI::App*, bool, bool, std::string) const override { return resolved(); }
  std::string resolved() const;

  std::set<const CLI::Option*> trainer_flags;
  const CLI::Option* print_flag = nullptr;

 private:
  bool in_a_section(const CLI::Option* option) const;
  const CLI::Option* find(const std::string& section, const std::string& key) const;
  std::vector<CLI::ConfigItem> read_section(const std::string& section, const YAML::Node& node) const;
  std::vector<std::string> inputs_of(const std::string& where, const YAML::Node& value) const;
  std::vector<std::string> values_of(const CLI::Option* option) const;
  [[noreturn]] void refuse(const std::string& what, const std::string& fix) const;

  const CLI::App& app_;
  mutable size_t reads_ = 0;  // which of several --config files is being read (CLI11 reads the last first)
};

// Not help (an option group has its own), version, the config flags themselves, nor the retired
// flags (hidden, in no group).
bool YamlConfig::in_a_section(const CLI::Option* option) const {
  if (option->get_lnames().empty() || option->get_group().empty()) return false;
  const std::string& name = option->get_lnames().front();
  return name != "help" && name != "help-all" && option != app_.get_version_ptr() &&
         option != app_.get_config_ptr() && option != print_flag;
}

const CLI::Option* YamlConfig::find(const std::string& section, const std::string& key) const {
  const std::string flag = flag_of(key);
  for (const CLI::Option* option : options_of(app_)) {
    if (!option->check_name(flag)) continue;
    if (option->get_group().empty()) return option;  // retired: CLI11 runs it, which says what replaced it
    if (in_a_section(option) && (trainer_flags.count(option) > 0) == (section == kTrainer)) return option;
  }
  return nullptr;
}

void YamlConfig::refuse(const std::string& what, const std::string& fix) const {
  const auto files = app_.get_config_ptr()->as<std::vector<std::string>>();
  const std::string file = files.empty() ? "" : files[files.size() - 1 - (reads_ - 1) % files.size()];
  throw UsageError("--config " + file + ": " + what + ". " + fix);
}

std::vector<std::string> YamlConfig::inputs_of(const std::string& where, const YAML::Node& value) const {
  if (value.IsScalar()) return {value.Scalar()};
  if (value.IsSequence()) {
    std::vector<std::string> inputs;
    for (const auto& item : value) {
      if (!item.IsScalar()) refuse(where + " holds a list of other than single values", "Give one value per item.");
      inputs.push_back(item.Scalar());
    }
    return inputs;
  }
  refuse(where + " holds a mapping, where a flag takes a value", "Give it a value, as on the command line.");
}

std::vector<CLI::ConfigItem> YamlConfig::read_section(const std::string& section, const YAML::Node& node) const {
  std::vector<CLI::ConfigItem> items;
  if (node.IsNull()) return items;
  if (!node.IsMap()) refuse(section + ": is not a mapping", "Write " + section + ": with one flag per line below it.");
  for (const auto& entry : node) {
    const std::string key = entry.first.Scalar(), where = section + "." + key;
    const CLI::Option* option = find(section, key);
    if (option == nullptr) {
      const std::string other = section == kTrainer ? kModel : kTrainer;
      if (find(other, key) != nullptr) refuse(where + " is a flag of " + other + ":", "Move it under " + other + ":.");
      std::vector<std::string> keys;
      for (const CLI::Option* o : options_of(app_)) {
        if (in_a_section(o) && (trainer_flags.count(o) > 0) == (section == kTrainer)) keys.push_back(key_of(o));
      }
      const std::string near = nearest(key, keys);
      refuse("unknown key " + where, (near.empty() ? "" : "Did you mean " + section + "." + near + "? ") +
                                         "The keys are the flags of --help without -- (max_epochs or max-epochs).");
    }
    if (entry.second.IsNull() || (entry.second.IsSequence() && entry.second.size() == 0)) continue;  // the default
    CLI::ConfigItem item;
    item.name = option->get_lnames().front();
    item.inputs = inputs_of(where, entry.second);
    items.push_back(item);
  }
  return items;
}

std::vector<CLI::ConfigItem> YamlConfig::from_config(std::istream& input) const {
  ++reads_;
  // Bounded: a path such as /dev/zero would otherwise be read for ever.
  std::string text(kMaxConfigBytes + 1, '\0');
  input.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(input.gcount()));
  if (text.size() > kMaxConfigBytes) refuse("it is over 1 MiB", "Give a config file of flags (a few KiB).");
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    refuse("not YAML (line " + std::to_string(e.mark.line + 1) + ": " + e.msg + ")", "Fix the file.");
  }
  if (root.IsNull()) return {};
  if (!root.IsMap()) refuse("it is not a mapping", top_level_fix(""));
  std::vector<CLI::ConfigItem> items;
  for (const auto& entry : root) {
    const std::string section = entry.first.Scalar();
    if (section != kTrainer && section != kModel) refuse("unknown key " + section, top_level_fix(section));
    const auto more = read_section(section, entry.second);
    items.insert(items.end(), more.begin(), more.end());
  }
  return items;
}

// As given (command line, --config, variable), else the value it holds: its default.
std::vector<std::string> YamlConfig::values_of(const CLI::Option* option) const {
  if (option->count() > 0) return option->results();
  auto* readable = const_cast<CLI::Option*>(option);  // capture_default_str reads the bound value anew
  const std::string shown = readable->get_default_str();
  readable->capture_default_str();
  const std::string value = readable->get_default_str();
  readable->default_str(shown);  // --help keeps what it showed (--fast-dev-run's "1" alone)
  if (value.empty()) return {};
  return {value};
}

std::string YamlConfig::resolved() const {
  YAML::Emitter out;
  out << YAML::BeginMap;
  for (const std::string& section : {kTrainer, kModel}) {
    std::vector<const CLI::Option*> options;
    for (const CLI::Option* o : options_of(app_)) {
      if (in_a_section(o) && (trainer_flags.count(o) > 0) == (section == kTrainer)) options.push_back(o);
    }
    if (options.empty()) continue;
    out << YAML::Key << section << YAML::Value << YAML::BeginMap;
    for (const CLI::Option* o : options) {
      out << YAML::Key << key_of(o) << YAML::Value;
      const auto values = values_of(o);
      if (values.empty()) {
        out << YAML::Null;  // unset: the program's default (an FSDP flag: what --strategy sets)
      } else if (values.size() == 1) {
        out << values.front();
      } else {
        out << YAML::Flow << values;
      }
    }
    out << YAML::EndMap;
  }
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

CLI::App& program_of(CLI::App& app) {
  CLI::App* root = &app;
  while (root->get_parent() != nullptr) root = root->get_parent();
  return *root;
}

}  // namespace

std::vector<const CLI::Option*> options_of(const CLI::App& app) {
  std::vector<const CLI::Option*> options = app.get_options();
  for (const CLI::App* group : app.get_subcommands([](const CLI::App* sub) { return sub->get_name().empty(); })) {
    const auto more = options_of(*group);
    options.insert(options.end(), more.begin(), more.end());
  }
  return options;
}

void enable_config(CLI::App& app, const std::vector<const CLI::Option*>& trainer_flags) {
  CLI::App& program = program_of(app);
  auto config = std::dynamic_pointer_cast<YamlConfig>(program.get_config_formatter());
  if (!config) {
    config = std::make_shared<YamlConfig>(program);
    program.set_config("--config", "",
                       "read flags from a YAML file: trainer: {max_epochs: 3} for the Trainer's, model: {lr: 0.05} "
                       "for the program's own; a flag on the command line wins over the file");
    config->print_flag = program.add_flag("--print-config", "print the resolved flags as YAML (a file for --config) and exit");
    program.config_formatter(config);
  }
  config->trainer_flags.insert(trainer_flags.begin(), trainer_flags.end());
}

std::string resolved_config(const CLI::App& app, bool& print) {
  const auto config = std::dynamic_pointer_cast<YamlConfig>(app.get_config_formatter());
  print = config && config->print_flag->count() > 0;
  return config ? config->resolved() : "";
}

}  // namespace detail
}  // namespace cli
}  // namespace lockstep
