#include <lockstep/plan/trainer_variables.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>

#include <lockstep/core/error.h>
#include <lockstep/core/number_text.h>
#include <lockstep/environments/cluster_environment.h>

namespace lockstep {

std::string trainer_variable(const std::string& field) {
  std::string name = field;
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::toupper(c); });
  return "LOCKSTEP_TRAINER_" + name;
}

std::optional<std::string> TrainerVariables::text(const char* field, bool at_default) const {
  if (!at_default) return std::nullopt;  // set in code: the code wins
  return environ_.get(trainer_variable(field));
}

void TrainerVariables::set(const char* field, std::string& value, const std::string& default_value,
                           const std::vector<std::string>& allowed) const {
  const auto given = text(field, value == default_value);
  if (!given) return;
  if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), *given) == allowed.end()) {
    std::string names;
    for (const auto& name : allowed) names += (names.empty() ? "" : " or ") + name;
    throw UsageError(trainer_variable(field) + "=" + *given + " is not known. Set it to " + names + ", or unset it.");
  }
  value = *given;
}

void TrainerVariables::set(const char* field, bool& value, bool default_value) const {
  const auto given = text(field, value == default_value);
  if (!given) return;
  std::string word = *given;
  std::transform(word.begin(), word.end(), word.begin(), [](unsigned char c) { return std::tolower(c); });
  if (word == "true" || word == "1" || word == "yes" || word == "on") {
    value = true;
  } else if (word == "false" || word == "0" || word == "no" || word == "off") {
    value = false;
  } else {
    throw UsageError(trainer_variable(field) + "=" + *given + " is not true or false. Set it to true or false, or "
                     "unset it.");
  }
}

void TrainerVariables::set(const char* field, int64_t& value, int64_t default_value, int64_t low, int64_t high) const {
  const auto given = text(field, value == default_value);
  if (!given) return;
  const std::string range = std::to_string(low) + ".." + std::to_string(high);
  char* end = nullptr;
  errno = 0;
  const long long parsed = std::strtoll(given->c_str(), &end, 10);
  LOCKSTEP_CHECK(!given->empty() && *end == '\0' && errno == 0, UsageError, trainer_variable(field), "=", *given,
                 " is not a whole number. Set it to one in ", range, ", or unset it.");
  LOCKSTEP_CHECK(parsed >= low && parsed <= high, UsageError, trainer_variable(field), "=", *given, " is outside ",
                 range, ". Set it to a number in that range, or unset it.");
  value = parsed;
}

void TrainerVariables::set(const char* field, int& value, int default_value, int low, int high) const {
  int64_t wide = value;
  set(field, wide, default_value, low, high);
  value = static_cast<int>(wide);
}

void TrainerVariables::set(const char* field, double& value, double default_value, double low, double high) const {
  const auto given = text(field, value == default_value);
  if (!given) return;
  const auto parsed = whole_number(*given);
  LOCKSTEP_CHECK(parsed, UsageError, trainer_variable(field), "=", *given, " is not a number. Set it to one such as ",
                 default_value, ", or unset it.");
  LOCKSTEP_CHECK(*parsed >= low && *parsed <= high, UsageError, trainer_variable(field), "=", *given, " is outside ",
                 low, "..", high, ". Set it to a number in that range, or unset it.");
  value = *parsed;
}

void TrainerVariables::set(const char* field, BatchLimit& value, const BatchLimit& default_value) const {
  if (const auto given = text(field, value == default_value)) value = BatchLimit::parse(*given, trainer_variable(field));
}

namespace {

// The --fsdp-* flags' variables are read by the flags (cli::add_trainer_flags) alone: options
// built in code give FSDP its settings in FSDPStrategy's constructor, so here one would do nothing.
void refuse_fsdp_variables(const environments::Environ& environ) {
  for (const char* field : {"fsdp_sharding", "fsdp_auto_wrap_min_params", "fsdp_auto_wrap_types",
                            "fsdp_activation_checkpointing_types", "fsdp_hybrid_shard_size", "fsdp_param_dtype",
                            "fsdp_reduce_dtype", "fsdp_state_dict_type"}) {
    const auto name = trainer_variable(field);
    if (const auto value = environ.get(name)) {
      throw UsageError(name + "=" + *value + " is read by the --fsdp-* flags, and this program takes no flags "
                       "(cli::add_trainer_flags). Give its FSDPStrategy the setting (ShardingOptions), name a "
                       "strategy that binds it (LOCKSTEP_TRAINER_STRATEGY=fsdp_shard_grad_op), or unset it.");
    }
  }
}

}  // namespace

void apply_trainer_variables(PlanOptions& o, const environments::Environ& environ) {
  if (!o.trainer_variables()) return;
  refuse_fsdp_variables(environ);
  const PlanOptions d;
  const TrainerVariables v(environ);
  v.set("accelerator", o.accelerator(), d.accelerator());
  v.set("devices", o.devices(), d.devices());
  v.set("strategy", o.strategy(), d.strategy());
  v.set("auto_select_gpus", o.auto_select_gpus(), d.auto_select_gpus());
  v.set("num_nodes", o.num_nodes(), d.num_nodes(), 1, 1 << 20);
  v.set("precision", o.precision(), d.precision());
  v.set("sync_batchnorm", o.sync_batchnorm(), d.sync_batchnorm());
  v.set("process_group_backend", o.process_group_backend(), d.process_group_backend());
  v.set("timeout", o.timeout(), d.timeout(), 0.001, 1e9);
  v.set("liveness_timeout", o.liveness_timeout(), d.liveness_timeout(), 0.0, 1e9);
  v.set("distributed_debug", o.distributed_debug(), d.distributed_debug());
  v.set("max_restarts", o.max_restarts(), d.max_restarts(), 0, int64_t{1} << 20);
  o.trainer_variables(false);
}

}  // namespace lockstep
