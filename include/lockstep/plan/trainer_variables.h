#pragma once
/// The LOCKSTEP_TRAINER_<FIELD> variables as defaults of options built in code, as Lightning
/// 2.x's PL_TRAINER_* are defaults of `Trainer(...)`: the Trainer and Fabric give every field
/// still at its default the value of its variable when they are made; a value set in code wins.
/// Options that came through the flags (cli/trainer_flags.h) have read the variables already.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <lockstep/plan/batch_limit.h>
#include <lockstep/plan/plan_options.h>

namespace lockstep {
namespace environments {
class Environ;
}

/// "max_epochs" -> "LOCKSTEP_TRAINER_MAX_EPOCHS", the variable of the flag --max-epochs.
std::string trainer_variable(const std::string& field);

/// Sets fields that still hold their defaults from their variables in `environ`. A value that
/// does not parse, or lies outside the range the flag takes, is a UsageError naming the variable:
///   TrainerVariables variables(environ);
///   variables.set("max_epochs", options.max_epochs(), TrainerOptions().max_epochs(), -1, 1 << 20);
class TrainerVariables {
 public:
  explicit TrainerVariables(const environments::Environ& environ) : environ_(environ) {}
  /// With `allowed`, a value outside it is a UsageError.
  void set(const char* field, std::string& value, const std::string& default_value,
           const std::vector<std::string>& allowed = {}) const;
  /// true|false (also 1|0, yes|no, on|off, as the flags take).
  void set(const char* field, bool& value, bool default_value) const;
  void set(const char* field, int64_t& value, int64_t default_value, int64_t low, int64_t high) const;
  void set(const char* field, int& value, int default_value, int low, int high) const;
  void set(const char* field, double& value, double default_value, double low, double high) const;
  /// A fraction (0.25) or a count (10), as BatchLimit::parse reads it.
  void set(const char* field, BatchLimit& value, const BatchLimit& default_value) const;

 private:
  /// The variable of `field` when it is set and the field holds its default.
  std::optional<std::string> text(const char* field, bool at_default) const;

  const environments::Environ& environ_;
};

/// Applies the variables of the PlanOptions fields (the plan flags, --accelerator to
/// --max-restarts) when `options.trainer_variables()` is true, then sets it to false; what
/// Fabric's constructor does. TrainerOptions has an overload (trainer/trainer_options.h).
void apply_trainer_variables(PlanOptions& options, const environments::Environ& environ);

}  // namespace lockstep
