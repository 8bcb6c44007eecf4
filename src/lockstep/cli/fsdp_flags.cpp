#include "fsdp_flags.h"

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <vector>

#include <lockstep/core/error.h>
#include <lockstep/strategies/fsdp_strategy.h>

namespace lockstep {
namespace cli {
namespace detail {
namespace {

// What the --fsdp-* flags (or their variables) gave; unset until given.
struct FsdpFlags {
  std::optional<distributed::ShardingStrategy> sharding;
  std::optional<int64_t> auto_wrap_min_params;
  std::optional<std::vector<std::string>> auto_wrap_types;
  std::optional<std::vector<std::string>> activation_checkpointing_types;
  std::optional<int> hybrid_shard_size;
  std::optional<at::ScalarType> param_dtype;
  std::optional<at::ScalarType> reduce_dtype;
  std::optional<strategies::StateDictType> state_dict_type;
  std::map<std::string, std::string> given;  // flag -> the text given, for messages
};

// "Block, Conv2d" -> {"Block", "Conv2d"}.
std::vector<std::string> type_names(const std::string& list) {
  std::vector<std::string> names;
  std::stringstream in(list);
  for (std::string name; std::getline(in, name, ',');) {
    name.erase(0, name.find_first_not_of(" \t"));
    name.erase(name.find_last_not_of(" \t") + 1);
    if (!name.empty()) names.push_back(name);
  }
  return names;
}

// --fsdp-param-dtype and --fsdp-reduce-dtype: "bf16" or "16".
at::ScalarType low_precision_dtype(const std::string& flag, const std::string& name) {
  if (name == "bf16" || name == "bfloat16") return at::kBFloat16;
  if (name == "16" || name == "float16" || name == "half") return at::kHalf;
  throw UsageError(flag + " '" + name + "' is not known. Use bf16 or 16 (float16), or drop it for float32.");
}

// A flag read as text: `read` turns the text into the setting (a UsageError is the flag's error,
// exit 2 while parsing) and records it as given.
template <typename Read>
CLI::Option* add_fsdp_flag(CLI::App& app, const std::shared_ptr<FsdpFlags>& flags, const std::string& flag,
                           const std::string& help, Read read) {
  return app
      .add_option_function<std::string>(
          flag,
          [flags, flag, read](const std::string& text) {
            try {
              read(*flags, text);
            } catch (const UsageError& e) {
              throw CLI::ValidationError(message_of(e));
            }
            flags->given[flag] = text;
          },
          help + " (default: what --strategy sets)")
      ->envname(variable_for(flag));
}

// A whole number, which the flag's CLI::Range has checked before `read` sees it.
int64_t whole(const std::string& text) { return std::stoll(text); }

// With a strategy that is no FSDPStrategy: every --fsdp-* flag given, and what to do.
std::string refusal(const FsdpFlags& flags, const std::string& strategy) {
  std::string named;
  bool dtype = false;
  for (const auto& [flag, text] : flags.given) {
    named += (named.empty() ? "" : " and ") + flag + " " + text;
    dtype = dtype || flag == "--fsdp-param-dtype" || flag == "--fsdp-reduce-dtype";
  }
  const bool one = flags.given.size() == 1;
  return named + (one ? " is" : " are") + " for --strategy fsdp (or fsdp_shard_grad_op, fsdp_shard_optimizer_state, "
         "fsdp_hybrid_shard, fsdp_no_shard), but the strategy is " + strategy + ". Add --strategy fsdp, or " +
         (dtype ? "use --precision bf16-mixed." : one ? "drop it." : "drop them.");
}

// The flags given, on the strategy the connector chose (its ShardingOptions win where unset).
void put_on(const FsdpFlags& flags, strategies::Strategy& strategy) {
  if (flags.given.empty()) return;
  auto* fsdp = dynamic_cast<strategies::FSDPStrategy*>(&strategy);
  if (!fsdp) throw UsageError(refusal(flags, strategy.name()));
  auto& o = fsdp->sharding_options();
  // A registered name such as fsdp_no_shard binds its sharding: a flag saying another is a contradiction.
  LOCKSTEP_CHECK(!flags.sharding || strategy.name() == "fsdp" || *flags.sharding == o.sharding_strategy(), UsageError,
                 "--fsdp-sharding ", flags.given.at("--fsdp-sharding"), " contradicts --strategy ", strategy.name(),
                 ", which shards ", distributed::to_string(o.sharding_strategy()), ". Use --strategy fsdp --fsdp-sharding ",
                 flags.given.at("--fsdp-sharding"), ", or drop the flag.");
  if (flags.sharding) o.sharding_strategy(*flags.sharding);
  if (flags.auto_wrap_min_params) o.auto_wrap_min_params(*flags.auto_wrap_min_params);
  if (flags.auto_wrap_types) o.auto_wrap_module_types(*flags.auto_wrap_types);
  if (flags.activation_checkpointing_types) o.activation_checkpointing_module_types(*flags.activation_checkpointing_types);
  if (flags.param_dtype) o.param_dtype(*flags.param_dtype);
  if (flags.reduce_dtype) o.reduce_dtype(*flags.reduce_dtype);
  if (flags.state_dict_type) fsdp->state_dict_type(*flags.state_dict_type);
  if (!flags.hybrid_shard_size) return;
  LOCKSTEP_CHECK(o.sharding_strategy() == distributed::ShardingStrategy::hybrid_shard, UsageError,
                 "--fsdp-hybrid-shard-size ", *flags.hybrid_shard_size, " is for HYBRID_SHARD (--strategy "
                 "fsdp_hybrid_shard), but the sharding of --strategy ", strategy.name(), " is ",
                 distributed::to_string(o.sharding_strategy()), ". Add --fsdp-sharding HYBRID_SHARD, or drop it.");
  o.hybrid_shard_size(*flags.hybrid_shard_size);
}

}  // namespace

void add_fsdp_flags(CLI::App& app, PlanOptions& options, bool trainer_checkpoints) {
  const auto flags = std::make_shared<FsdpFlags>();
  add_fsdp_flag(app, flags, "--fsdp-sharding", "FSDP: FULL_SHARD|SHARD_GRAD_OP|SHARD_OPTIMIZER_STATE|HYBRID_SHARD|NO_SHARD",
                [](FsdpFlags& f, const std::string& text) {
                  try {
                    f.sharding = distributed::parse_sharding_strategy(text);
                  } catch (const UsageError& e) {
                    throw UsageError("--fsdp-sharding: " + message_of(e));
                  }
                });
  add_fsdp_flag(app, flags, "--fsdp-auto-wrap-min-params",
                "FSDP: Sequential children with this many parameters are units of their own (0: one unit)",
                [](FsdpFlags& f, const std::string& text) { f.auto_wrap_min_params = whole(text); })
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 50));
  add_fsdp_flag(app, flags, "--fsdp-auto-wrap-types",
                "FSDP: Sequential children of these types (comma-separated: Block,Conv2d) are units",
                [](FsdpFlags& f, const std::string& text) { f.auto_wrap_types = type_names(text); });
  add_fsdp_flag(app, flags, "--fsdp-activation-checkpointing-types",
                "FSDP: Sequential children of these types are units whose activations backward recomputes",
                [](FsdpFlags& f, const std::string& text) { f.activation_checkpointing_types = type_names(text); });
  add_fsdp_flag(app, flags, "--fsdp-hybrid-shard-size",
                "FSDP HYBRID_SHARD: consecutive ranks that shard one copy (0: each node's)",
                [](FsdpFlags& f, const std::string& text) { f.hybrid_shard_size = static_cast<int>(whole(text)); })
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  add_fsdp_flag(app, flags, "--fsdp-param-dtype",
                "FSDP: bf16|16: child units gathered and computed in it, shards and optimizer in float32",
                [](FsdpFlags& f, const std::string& text) { f.param_dtype = low_precision_dtype("--fsdp-param-dtype", text); });
  add_fsdp_flag(app, flags, "--fsdp-reduce-dtype", "FSDP: bf16|16: the dtype gradients are reduced in",
                [](FsdpFlags& f, const std::string& text) { f.reduce_dtype = low_precision_dtype("--fsdp-reduce-dtype", text); });
  if (trainer_checkpoints) {
    add_fsdp_flag(app, flags, "--fsdp-state-dict-type",
                  "FSDP: full|sharded|dcp: checkpoints whole in one file, or each rank's pieces in a directory "
                  "(dcp: in torch.distributed.checkpoint's format, which Python's dcp.load reads)",
                  [](FsdpFlags& f, const std::string& text) {
                    try {
                      f.state_dict_type = strategies::parse_state_dict_type(text);
                    } catch (const UsageError& e) {
                      throw UsageError("--fsdp-state-dict-type: " + message_of(e));
                    }
                  });
  }
  options.configure_strategy([flags, before = options.configure_strategy()](strategies::Strategy& strategy) {
    if (before) before(strategy);
    put_on(*flags, strategy);
  });
}

}  // namespace detail
}  // namespace cli
}  // namespace lockstep
