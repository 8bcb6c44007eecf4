#pragma once
// --config FILE.yaml and --print-config: the flags read from a YAML file, as LightningCLI reads
// its config, and the resolved flags written back as YAML.
//   trainer:            the Trainer's (or Fabric's) flags, without -- ("max_epochs" or "max-epochs")
//     max_epochs: 3
//   model:              the program's own flags (--lr, --batch-size, ...)
//     lr: 0.05
// A flag on the command line wins over the file wherever it stands; the file wins over the
// LOCKSTEP_TRAINER_* variables, which win over the program's defaults (CLI11's order).

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace lockstep {
namespace cli {
namespace detail {

/// The closest of `known` to `given`, when it is close enough to be a typo; else "".
std::string nearest(const std::string& given, const std::vector<std::string>& known);

/// Adds --config and --print-config to the program `app` belongs to (once), and counts
/// `trainer_flags` (options of `app` or its groups) as the `trainer:` section's.
void enable_config(CLI::App& app, const std::vector<const CLI::Option*>& trainer_flags);

/// The options `app` holds now, its option groups' included.
std::vector<const CLI::Option*> options_of(const CLI::App& app);

/// After a successful parse: the resolved flags as YAML when the program has --config, else "";
/// `print` is true when --print-config was given.
std::string resolved_config(const CLI::App& app, bool& print);

}  // namespace detail
}  // namespace cli
}  // namespace lockstep
