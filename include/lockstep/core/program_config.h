#pragma once
/// The program's resolved flags as YAML: what `--print-config` prints and `--config` reads back.
/// cli::parse_or_exit_code sets it when the flags parse; the Trainer writes it to
/// `<log_dir>/config.yaml` on rank 0 when fit starts (LightningCLI's SaveConfigCallback), so that
/// `prog --config <log_dir>/config.yaml` repeats the run.

#include <string>

namespace lockstep {

/// Replaces the program's config ("" for none: the Trainer then writes no config.yaml).
void set_program_config(const std::string& yaml);

/// The program's config; "" until a program with the Trainer's (or Fabric's) flags parsed them.
std::string program_config();

}  // namespace lockstep
