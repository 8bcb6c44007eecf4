#include <lockstep/checkpoint/lightning_checkpoint.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include <torch/torch.h>

#include <lockstep/core/error.h>

#include "prefix_rule.h"

namespace lockstep {
namespace checkpoint {
namespace {

using Dict = c10::impl::GenericDict;
using ModuleState = std::vector<std::pair<std::string, std::vector<int64_t>>>;

const char* const kVersionKey = "pytorch-lightning_version";

[[noreturn]] void refuse(const std::string& path, const std::string& what) {
  throw UsageError("Lightning checkpoint '" + path + "': " + what + ".");
}

// The value under `keys` in nested dicts; None where a level is missing or not a dict.
c10::IValue at_path(const c10::IValue& root, std::initializer_list<const char*> keys) {
  c10::IValue value = root;
  for (const char* key : keys) {
    if (!value.isGenericDict() || !value.toGenericDict().contains(key)) return c10::IValue();
    value = value.toGenericDict().at(key);
  }
  return value;
}

std::optional<int64_t> int_at(const c10::IValue& root, std::initializer_list<const char*> keys) {
  const auto value = at_path(root, keys);
  return value.isInt() ? std::optional<int64_t>(value.toInt()) : std::nullopt;
}

// Up to six names (quoted) or phrases, then how many more.
std::string some(const std::vector<std::string>& names, bool quoted = true) {
  const std::string q = quoted ? "'" : "";
  std::string text;
  for (size_t i = 0; i < names.size() && i < 6; ++i) text += (i ? ", " : "") + q + names[i] + q;
  if (names.size() > 6) text += " and " + std::to_string(names.size() - 6) + " more";
  return text.empty() ? "none" : text;
}

// The module's names for the file's: `rename` when given, else the one prefix rule (the
// LightningModule's attribute, or the C++ module's) that turns every name of the file into the
// module's.
KeyMap name_map(const std::vector<std::string>& keys, const ModuleState& module, const KeyMap& rename) {
  if (!rename.empty()) return rename;
  std::set<std::string> own;
  for (const auto& [name, shape] : module) own.insert(name);
  const std::set<std::string> file(keys.begin(), keys.end());
  std::vector<std::string> unexpected, missing;
  for (const auto& key : keys) {
    if (!own.count(key)) unexpected.push_back(key);
  }
  for (const auto& [name, shape] : module) {
    if (!file.count(name)) missing.push_back(name);
  }
  const auto [from, to] = detail::suggest_prefix_rule(unexpected, missing);
  return from == to ? KeyMap() : KeyMap().rename_prefix(from, to);
}

// The file's weights under the module's names; every name and shape must match.
Dict module_weights(const Checkpoint& lightning, const ModuleState& module, const KeyMap& rename,
                    const std::string& path, std::string& how) {
  const auto value = at_path(lightning, {"state_dict"});
  if (!value.isGenericDict()) refuse(path, "it has no \"state_dict\" dict of weights by name");
  const Dict state = value.toGenericDict();
  std::vector<std::string> keys;
  for (const auto& entry : state) {
    if (!entry.key().isString() || !entry.value().isTensor()) refuse(path, "its \"state_dict\" holds other than tensors by name");
    keys.push_back(entry.key().toStringRef());
  }
  const KeyMap map = name_map(keys, module, rename);
  const Dict renamed = map.apply(state);
  std::map<std::string, std::vector<int64_t>> own(module.begin(), module.end());
  std::vector<std::string> unexpected, missing, shapes;
  for (const auto& entry : renamed) {
    const auto it = own.find(entry.key().toStringRef());
    if (it == own.end()) {
      unexpected.push_back(entry.key().toStringRef());
    } else if (entry.value().toTensor().sizes().vec() != it->second) {
      shapes.push_back("'" + it->first + "' is " + c10::str(entry.value().toTensor().sizes()) + " in the file and " +
                       c10::str(c10::IntArrayRef(it->second)) + " in the module");
    }
  }
  for (const auto& [name, shape] : module) {
    if (!renamed.contains(name)) missing.push_back(name);
  }
  if (!shapes.empty()) {
    refuse(path, "its weights are of another model: " + some(shapes, false) + ". Resume it with the model that wrote it");
  }
  if (!unexpected.empty() || !missing.empty()) {
    refuse(path, "its names do not match the module's" + std::string(map.empty() ? "" : " after the rules '" + map.str() + "'") +
                 ": the module lacks " + some(unexpected) + "; the file lacks " + some(missing) +
                 ". Give the rules that rename the file's names to the module's, e.g. --ckpt-path-rename model.=net. "
                 "(FROM=TO prefixes, comma-separated)");
  }
  how = std::to_string(keys.size()) + " tensors" + (map.empty() ? "" : ", the file's names renamed by '" + map.str() + "'");
  return renamed;
}

// The torch.optim class whose state_dict this is, from its param groups' keys.
std::string python_optimizer(const c10::IValue& state) {
  const auto group = at_path(state, {"param_groups"});
  if (!group.isList() || group.toListRef().empty() || !group.toListRef()[0].isGenericDict()) return "?";
  const Dict g = group.toListRef()[0].toGenericDict();
  if (g.contains("momentum") && g.contains("nesterov")) return "SGD";
  if (g.contains("betas") && g.contains("amsgrad")) {
    const bool decoupled = g.contains("decoupled_weight_decay") && g.at("decoupled_weight_decay").isBool() &&
                           g.at("decoupled_weight_decay").toBool();
    return decoupled ? "AdamW" : "Adam";
  }
  const std::vector<std::pair<const char*, const char*>> others{
      {"alpha", "RMSprop"}, {"lr_decay", "Adagrad"}, {"rho", "Adadelta"}, {"momentum_decay", "NAdam"},
      {"lambd", "ASGD"}, {"etas", "Rprop"}, {"max_iter", "LBFGS"}, {"betas", "RAdam or Adamax"}};
  for (const auto& [key, name] : others) {
    if (g.contains(key)) return name;
  }
  return "?";
}

std::string lockstep_optimizer(const torch::optim::Optimizer& optimizer) {
  if (dynamic_cast<const torch::optim::SGD*>(&optimizer)) return "SGD";
  if (dynamic_cast<const torch::optim::Adam*>(&optimizer)) return "Adam";
  if (dynamic_cast<const torch::optim::AdamW*>(&optimizer)) return "AdamW";
  return c10::demangle(typeid(optimizer).name());
}

// The optimizer states as they are (Python's layout is the Trainer's), after checking that each
// is the state of the optimizer configure_optimizers returns.
c10::impl::GenericList optimizer_states(const Checkpoint& lightning, const OptimizerConfig& config,
                                        const std::string& path, std::string& how) {
  const auto value = at_path(lightning, {"optimizer_states"});
  if (!value.isList()) {
    refuse(path, "it has no \"optimizer_states\" list, as ModelCheckpoint(save_weights_only=True) writes. Start "
                 "from its weights with --init-weights " + path + " instead");
  }
  const auto states = value.toList();
  if (states.size() != config.optimizers.size()) {
    refuse(path, "it holds " + std::to_string(states.size()) + " optimizer state(s) and configure_optimizers returns " +
                 std::to_string(config.optimizers.size()) + ". Return as many optimizers as the LightningModule's "
                 "configure_optimizers did, in its order");
  }
  for (size_t i = 0; i < states.size(); ++i) {
    const std::string theirs = python_optimizer(states.get(i)), ours = lockstep_optimizer(*config.optimizers[i]);
    const std::string which = "optimizer " + std::to_string(i);
    if (theirs != "SGD" && theirs != "Adam" && theirs != "AdamW") {
      refuse(path, which + " is torch.optim." + (theirs == "?" ? std::string("(unknown)") : theirs) + ", whose state "
                   "Lockstep cannot restore (it restores SGD, Adam and AdamW). Resume this run in Lightning, or train "
                   "with one of those");
    }
    if (theirs != ours) {
      refuse(path, which + " is torch.optim." + theirs + " and configure_optimizers returns " + ours + ". Return "
                   "torch::optim::" + theirs + " there, as the LightningModule did");
    }
    const auto group = at_path(states.get(i), {"param_groups"}).toListRef()[0].toGenericDict();
    if (group.contains("maximize") && group.at("maximize").isBool() && group.at("maximize").toBool()) {
      refuse(path, which + " has maximize=True, which torch::optim lacks. Resume this run in Lightning");
    }
    how += (i ? ", " : "") + theirs;
  }
  return states;
}

// A ReduceLROnPlateau's counters from PyTorch's state of one (for another scheduler: empty).
Dict plateau_state(const c10::IValue& theirs, const SchedulerConfig& ours, size_t i, const std::string& path) {
  Dict state(c10::StringType::get(), c10::AnyType::get());
  if (dynamic_cast<ReduceLROnPlateau*>(ours.scheduler.get()) == nullptr) return state;
  const auto best = at_path(theirs, {"best"});
  const auto bad = int_at(theirs, {"num_bad_epochs"}), cooldown = int_at(theirs, {"cooldown_counter"});
  if (!(best.isDouble() || best.isInt()) || !bad || !cooldown) {
    refuse(path, "LR scheduler " + std::to_string(i) + " is a ReduceLROnPlateau in configure_optimizers, and the "
                 "file's has no best, num_bad_epochs and cooldown_counter. Return the schedulers the "
                 "LightningModule returned, in its order");
  }
  state.insert("best", best.isDouble() ? best.toDouble() : static_cast<double>(best.toInt()));
  state.insert("num_bad_epochs", *bad);
  state.insert("cooldown_counter", *cooldown);
  state.insert("last_epoch", int_at(theirs, {"last_epoch"}).value_or(0));
  return state;
}

// Each LR scheduler's step count (Python's last_epoch), counted per interval as the Trainer does,
// and each ReduceLROnPlateau's counters.
Dict scheduler_steps(const Checkpoint& lightning, const OptimizerConfig& config, const std::string& path) {
  const auto value = at_path(lightning, {"lr_schedulers"});
  const auto states = value.isList() ? value.toList() : c10::impl::GenericList(c10::AnyType::get());
  if (states.size() != config.schedulers.size()) {
    refuse(path, "it holds " + std::to_string(states.size()) + " LR scheduler state(s) and configure_optimizers "
                 "returns " + std::to_string(config.schedulers.size()) + " scheduler(s). Return one for each that "
                 "the LightningModule returned, in its order");
  }
  std::map<std::string, int64_t> steps{{"epoch", 0}, {"step", 0}};
  std::map<std::string, bool> seen;
  c10::impl::GenericList plateaus(c10::AnyType::get());
  for (size_t i = 0; i < states.size(); ++i) {
    plateaus.push_back(plateau_state(states.get(i), config.schedulers[i], i, path));
    if (!plateaus.get(i).toGenericDict().empty()) continue;  // stepped with its metric, not replayed
    const auto last = int_at(states.get(i), {"last_epoch"});
    if (!last || *last < 0) refuse(path, "LR scheduler " + std::to_string(i) + " has no step count (last_epoch)");
    const std::string& interval = config.schedulers[i].interval;
    if (seen[interval] && steps[interval] != *last) {
      refuse(path, "its \"" + interval + "\" schedulers have taken different numbers of steps, and the Trainer keeps "
                   "one count per interval. Resume this run in Lightning");
    }
    seen[interval] = true;
    steps[interval] = *last;
  }
  Dict out(c10::StringType::get(), c10::AnyType::get());
  out.insert("epoch_steps", steps["epoch"]);
  out.insert("step_steps", steps["step"]);
  out.insert("plateau", plateaus);
  return out;
}

// Where Lightning would continue: an epoch whose batches all ran (its checkpoint is written at
// the epoch's end, before the epoch counts as completed) continues with the next.
Dict position(const Checkpoint& lightning, const std::string& path, std::string& how) {
  const auto epoch = int_at(lightning, {"epoch"});
  if (!epoch) refuse(path, "it has no integer \"epoch\"");
  const auto fit = at_path(lightning, {"loops", "fit_loop"});
  const auto processed = int_at(fit, {"epoch_progress", "current", "processed"});
  const auto completed = int_at(fit, {"epoch_progress", "current", "completed"});
  const auto batches = int_at(fit, {"epoch_loop.batch_progress", "current", "completed"});
  const auto last = at_path(fit, {"epoch_loop.batch_progress", "is_last_batch"});
  int64_t next_epoch = *epoch + 1, next_batch = 0;
  if (!processed || !completed || !batches) {
    how = "; it has no loop state, so it is taken as written at the end of epoch " + std::to_string(*epoch);
  } else if (*processed > *completed || (last.isBool() && last.toBool() && *batches > 0)) {
    next_epoch = std::max(*processed, *completed + 1);
  } else {
    next_epoch = *completed;
    next_batch = *batches;
    if (next_batch > 0) {
      how = "; it was written mid-epoch, and Lockstep skips the " + std::to_string(next_batch) + " batch(es) it ran "
            "(Lightning restarts a loader that keeps no state)";
    }
  }
  Dict loops(c10::StringType::get(), c10::AnyType::get());
  loops.insert("next_epoch", next_epoch);
  loops.insert("next_batch", next_batch);
  return loops;
}

// What of the file is not carried over, named for the note.
std::string left_out(const Checkpoint& lightning) {
  std::vector<std::string> parts;
  for (const auto& entry : lightning) {
    const std::string& key = entry.key().toStringRef();
    if (key == "state_dict" || key == "optimizer_states" || key == "epoch" || key == "global_step" || key == kVersionKey) continue;
    std::vector<std::string> names;
    if (entry.value().isGenericDict()) {
      for (const auto& inner : entry.value().toGenericDict()) {
        if (inner.key().isString()) names.push_back(inner.key().toStringRef());
      }
    }
    if (key == "callbacks") {
      parts.push_back("callbacks' state (" + some(names) + ")");
    } else if (key == "loops") {
      parts.push_back("the loops' counters other than the epoch and batch to continue from");
    } else if (key == "lr_schedulers") {
      parts.push_back("the LR schedulers' Python state other than their step counts (base_lrs, _last_lr, lr_lambdas: "
                      "the schedulers configure_optimizers returns set the rates from here on)");
    } else {
      parts.push_back("\"" + key + "\"" + (names.empty() ? "" : " (" + some(names) + ")"));
    }
  }
  std::string text;
  for (size_t i = 0; i < parts.size(); ++i) text += (i ? "; " : "") + parts[i];
  return text;
}

}  // namespace

bool is_lightning_checkpoint(const Checkpoint& checkpoint) { return checkpoint.contains(kVersionKey); }

LightningResume from_lightning_checkpoint(const Checkpoint& lightning, const ModuleState& module_state,
                                          const OptimizerConfig& config, const KeyMap& rename, const std::string& path) {
  std::string weights, optimizers, where;
  LightningResume resume{make_checkpoint(), ""};
  resume.checkpoint.insert("state_dict", module_weights(lightning, module_state, rename, path, weights));
  resume.checkpoint.insert("optimizer_states", optimizer_states(lightning, config, path, optimizers));
  resume.checkpoint.insert("lr_schedulers", scheduler_steps(lightning, config, path));
  const auto loops = position(lightning, path, where);
  resume.checkpoint.insert("loops", loops);
  const auto epoch = int_at(lightning, {"epoch"});
  const auto step = int_at(lightning, {"global_step"});
  if (!step || *step < 0) refuse(path, "it has no \"global_step\" count");
  resume.checkpoint.insert("epoch", *epoch);
  resume.checkpoint.insert("global_step", *step);
  const auto version = lightning.at(kVersionKey);
  const std::string taken = "its weights (" + weights + "), the state of its optimizer(s) (" + optimizers + ")" +
                            (config.schedulers.empty() ? "" : ", its LR schedulers' step counts") +
                            ", and global step " + std::to_string(*step);
  const std::string others = left_out(lightning);
  resume.note = "'" + path + "' is a Lightning " + (version.isString() ? version.toStringRef() : "") +
                " checkpoint: the run continues at epoch " + std::to_string(loops.at("next_epoch").toInt()) +
                (loops.at("next_batch").toInt() > 0 ? ", batch " + std::to_string(loops.at("next_batch").toInt()) : "") +
                " with " + taken + where + "." + (others.empty() ? "" : " Not carried over: " + others + ".");
  return resume;
}

}  // namespace checkpoint
}  // namespace lockstep
