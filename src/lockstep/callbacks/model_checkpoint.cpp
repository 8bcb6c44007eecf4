#include <lockstep/callbacks/model_checkpoint.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <limits>
#include <regex>
#include <stdexcept>
#include <vector>

#include <lockstep/callbacks/metric_format.h>
#include <lockstep/core/error.h>

namespace lockstep {
namespace {

constexpr const char* kDefaultFilename = "{epoch}-{step}";
constexpr const char* kLastFilename = "last";
constexpr const char* kExtension = ".ckpt";

// `value` under a Python format spec ("", ".2f", "03d", "+.3e", ".1%"), through printf.
std::string format_value(double value, const std::string& spec, bool integer, const std::string& pattern) {
  if (spec.empty()) return integer ? std::to_string(static_cast<long long>(value)) : detail::python_float(value);
  static const std::regex grammar(R"(([-+ ]?)(#?)(0?)(\d*)(\.\d+)?([deEfFgG%]?))");
  std::smatch m;
  if (!std::regex_match(spec, m, grammar)) {
    throw UsageError("ModelCheckpoint filename '" + pattern + "': the format spec '" + spec +
                     "' is not supported; use one such as .2f, .4e, .3g or 03d.");
  }
  char type = m[6].length() > 0 ? m[6].str()[0] : (integer && m[5].length() == 0 ? 'd' : 'g');
  std::string suffix;
  if (type == '%') {
    value *= 100;
    type = 'f';
    suffix = "%";
  }
  const std::string sign = m[1].str() == "-" ? "" : m[1].str();  // Python's '-' is printf's default
  std::string format = "%" + sign + m[2].str() + m[3].str() + m[4].str() + m[5].str();
  char buffer[128];
  if (type == 'd') {
    std::snprintf(buffer, sizeof buffer, (format + "lld").c_str(), static_cast<long long>(std::llround(value)));
  } else {
    std::snprintf(buffer, sizeof buffer, (format + type).c_str(), value);
  }
  return buffer + suffix;
}

std::string python_list(const std::map<std::string, double>& metrics) {
  std::string list = "[";
  for (const auto& [name, value] : metrics) list += (list.size() > 1 ? ", '" : "'") + name + "'";
  return list + "]";
}

c10::IValue optional_value(const std::optional<double>& value) { return value ? c10::IValue(*value) : c10::IValue(); }

// A score as Lightning or Python may have written it: a float, an int, a 0-dim tensor, or None.
std::optional<double> read_score(const c10::IValue& value) {
  if (value.isDouble()) return value.toDouble();
  if (value.isInt()) return static_cast<double>(value.toInt());
  if (value.isTensor()) return value.toTensor().item<double>();
  return std::nullopt;
}

std::string read_string(const c10::impl::GenericDict& dict, const std::string& key) {
  if (!dict.contains(key)) return "";
  const auto value = dict.at(key);
  return value.isString() ? value.toStringRef() : "";
}

std::optional<double> read_score(const c10::impl::GenericDict& dict, const std::string& key) {
  return dict.contains(key) ? read_score(dict.at(key)) : std::nullopt;
}

// The weights written beside the checkpoint at `path` with save_safetensors.
std::string weights_path(const std::string& path, int world_size) {
  const std::string ending = ".ckpt";
  const bool ckpt = path.size() > ending.size() && path.compare(path.size() - ending.size(), ending.size(), ending) == 0;
  return (ckpt ? path.substr(0, path.size() - ending.size()) : path) +
         (world_size > 1 ? ".safetensors.index.json" : ".safetensors");
}

// As Lightning: at most one of the three says when to save.
void check_one_trigger(const ModelCheckpointOptions& o) {
  std::vector<std::string> set;
  if (o.every_n_epochs().value_or(0) > 0) set.push_back("every_n_epochs=" + std::to_string(*o.every_n_epochs()));
  if (o.every_n_train_steps() > 0) set.push_back("every_n_train_steps=" + std::to_string(o.every_n_train_steps()));
  if (o.train_time_interval() > 0) set.push_back("train_time_interval=" + detail::python_float(o.train_time_interval()));
  if (set.size() < 2) return;
  std::string given = set[0];
  for (size_t i = 1; i < set.size(); ++i) given += ", " + set[i];
  throw UsageError("ModelCheckpoint(" + given + "): every_n_epochs, every_n_train_steps and train_time_interval are "
                   "mutually exclusive; set only one of them (add a second ModelCheckpoint for a second schedule).");
}

}  // namespace

/// What rank 0 decided at one top-k save point; every rank carries it out.
struct ModelCheckpoint::TopKDecision {
  std::string error;  ///< non-empty: every rank throws it, as a lockstep::Error of this kind and code
  ErrorKind error_kind = ErrorKind::usage;
  int exit_code = default_exit_code(ErrorKind::usage);
  std::string save;    ///< the checkpoint to write, or ""
  std::string remove;  ///< the checkpoint that fell out of the top k, or ""
};

ModelCheckpoint::ModelCheckpoint(ModelCheckpointOptions options) : options_(std::move(options)) {
  const auto& o = options_;
  if (o.save_top_k() < -1) {
    throw UsageError("ModelCheckpoint(save_top_k=" + std::to_string(o.save_top_k()) +
                     ") is invalid: use -1 (keep all), 0 (none) or a count k >= 1.");
  }
  if (o.mode() != "min" && o.mode() != "max") {
    throw UsageError("ModelCheckpoint(mode='" + o.mode() +
                     "') is invalid: use \"min\" (lower is better, e.g. a loss) or \"max\" (e.g. an accuracy).");
  }
  if (o.monitor().empty() && o.save_top_k() > 1) {
    throw UsageError("ModelCheckpoint(save_top_k=" + std::to_string(o.save_top_k()) +
                     ", monitor='') is not a valid configuration: no quantity ranks the top k. Set monitor "
                     "(e.g. \"val_loss\"), or use save_top_k -1 (keep all) or 1 (keep the latest).");
  }
  if (o.every_n_train_steps() < 0 || o.every_n_epochs().value_or(0) < 0) {
    throw UsageError("ModelCheckpoint: every_n_epochs and every_n_train_steps must be >= 0 (0 turns one off).");
  }
  if (!(o.train_time_interval() >= 0) || std::isinf(o.train_time_interval())) {
    throw UsageError("ModelCheckpoint(train_time_interval=" + detail::python_float(o.train_time_interval()) +
                     ") is invalid: give the seconds between saves, a finite number > 0 (0 turns it off).");
  }
  check_one_trigger(o);
  every_n_epochs_ = o.every_n_epochs().value_or(o.every_n_train_steps() > 0 || o.train_time_interval() > 0 ? 0 : 1);
  dirpath_ = o.dirpath();
}

std::string ModelCheckpoint::name() const {
  const std::string monitor = options_.monitor().empty() ? "None" : "'" + options_.monitor() + "'";
  return "ModelCheckpoint{'monitor': " + monitor + ", 'mode': '" + options_.mode() +
         "', 'every_n_train_steps': " + std::to_string(options_.every_n_train_steps()) +
         ", 'every_n_epochs': " + std::to_string(every_n_epochs_) +
         (options_.train_time_interval() > 0
              ? ", 'train_time_interval': " + detail::python_float(options_.train_time_interval())
              : std::string()) +
         "}";
}

std::string ModelCheckpoint::format_checkpoint_name(const std::map<std::string, double>& metrics,
                                                    const std::string& filename, int64_t version) const {
  const std::string pattern =
      !filename.empty() ? filename : options_.filename().empty() ? kDefaultFilename : options_.filename();
  std::string name;
  for (size_t i = 0; i < pattern.size();) {
    if (pattern[i] != '{') {
      name += pattern[i++];
      continue;
    }
    const size_t close = pattern.find('}', i);
    if (close == std::string::npos) {
      throw UsageError("ModelCheckpoint filename '" + pattern + "' has a '{' without its '}'; write e.g. "
                       "\"{epoch}-{val_loss:.2f}\".");
    }
    const std::string field = pattern.substr(i + 1, close - i - 1);
    const size_t colon = field.find(':');
    const std::string key = field.substr(0, colon);
    const std::string spec = colon == std::string::npos ? "" : field.substr(colon + 1);
    const auto it = metrics.find(key);
    const bool integer = it == metrics.end() || key == "epoch" || key == "step";  // as Lightning: absent = 0
    if (options_.auto_insert_metric_name()) name += key + "=";
    name += format_value(it == metrics.end() ? 0.0 : it->second, spec, integer, pattern);
    i = close + 1;
  }
  if (version > 0) name += "-v" + std::to_string(version);
  return (std::filesystem::path(dirpath_) / (name + kExtension)).string();
}

void ModelCheckpoint::on_fit_start(TrainerView& trainer, TrainingModule& module) {
  fitting_ = true;
  validation_ran_ = false;
  warned_missing_ = false;
  last_global_step_saved_ = trainer.global_step();
  // The clock starts with every fit, a resumed one too (Lightning keeps no time in checkpoints):
  // a resume starts from a saved state, so it has no unsaved work yet.
  last_step_timed_ = trainer.global_step();
  last_time_checked_ = std::chrono::steady_clock::now();
  if (options_.dirpath().empty()) dirpath_ = (std::filesystem::path(trainer.log_dir()) / "checkpoints").string();
  if (!loaded_dirpath_) return;
  if (*loaded_dirpath_ != dirpath_) {
    // A resumed run saves into its own folder (the Trainer says where): the earlier run's top k
    // stay there, and only best_model_path and best_model_score carry over.
    best_k_models_.clear();
    kth_best_model_path_.clear();
    kth_value_.reset();
    last_model_path_.clear();
  }
  loaded_dirpath_.reset();
}

void ModelCheckpoint::on_fit_end(TrainerView& trainer, TrainingModule& module) { fitting_ = false; }

namespace {

// Validation runs within the epoch (val_check_interval below one epoch): then, as in Lightning,
// the checkpoint is taken after each validation rather than at the epoch's end, so that every
// validation's score competes.
bool validates_within_the_epoch(const TrainerView& trainer) {
  return trainer.val_check_batch() < trainer.num_training_batches();
}

}  // namespace

void ModelCheckpoint::on_validation_end(TrainerView& trainer, TrainingModule& module) {
  if (fitting_ && !trainer.sanity_checking()) validation_ran_ = true;
  if (!validates_within_the_epoch(trainer) || skip_saving(trainer)) return;
  if (every_n_epochs_ >= 1 && (trainer.current_epoch() + 1) % every_n_epochs_ == 0) save_topk(trainer, false);
  save_last(trainer);
}

bool ModelCheckpoint::skip_saving(TrainerView& trainer) const {
  return !fitting_ || trainer.sanity_checking() || trainer.fast_dev_run() > 0 ||
         last_global_step_saved_ == trainer.global_step();
}

void ModelCheckpoint::on_train_batch_end(TrainerView& trainer, TrainingModule& module, const torch::Tensor& loss,
                                         int64_t batch_idx) {
  if (skip_saving(trainer)) return;
  const int64_t n = options_.every_n_train_steps();
  const bool steps_due = n >= 1 && trainer.global_step() % n == 0;
  if (!train_time_due(trainer) && !steps_due) return;
  save_topk(trainer, false);
  save_last(trainer);
}

bool ModelCheckpoint::train_time_due(TrainerView& trainer) {
  // Only where an optimizer step ended (global_step moved, on every rank alike): a save within
  // gradient accumulation would not hold the gradients gathered so far.
  if (options_.train_time_interval() <= 0 || trainer.global_step() == last_step_timed_) return false;
  last_step_timed_ = trainer.global_step();
  const auto now = std::chrono::steady_clock::now();
  bool due = trainer.is_global_zero() &&
             std::chrono::duration<double>(now - last_time_checked_).count() >= options_.train_time_interval();
  // Rank 0 decides for all: clocks that differ near the interval would save at different steps,
  // and a save is a collective. One all-reduce of a float, cheaper than a broadcast's two.
  if (trainer.world_size() > 1) due = trainer.any_rank(due);
  if (due) last_time_checked_ = now;  // as Lightning: the save's own time counts towards the next
  return due;
}

void ModelCheckpoint::on_train_epoch_end(TrainerView& trainer, TrainingModule& module) {
  if (skip_saving(trainer)) return;
  if (every_n_epochs_ >= 1 && (trainer.current_epoch() + 1) % every_n_epochs_ == 0) save_topk(trainer, true);
  save_last(trainer);
}

std::map<std::string, double> ModelCheckpoint::monitor_candidates(TrainerView& trainer) const {
  auto candidates = trainer.callback_metrics();
  candidates.emplace("epoch", static_cast<double>(trainer.current_epoch()));
  candidates.emplace("step", static_cast<double>(trainer.global_step()));
  return candidates;
}

void ModelCheckpoint::save(TrainerView& trainer, const std::string& path) {
  trainer.save_checkpoint(path);
  if (options_.save_safetensors()) trainer.save_checkpoint(weights_path(path, trainer.world_size()));
  last_global_step_saved_ = trainer.global_step();
}

void ModelCheckpoint::remove(TrainerView& trainer, const std::string& path) {
  trainer.remove_checkpoint(path);
  if (options_.save_safetensors()) trainer.remove_checkpoint(weights_path(path, trainer.world_size()));
}

void ModelCheckpoint::save_topk(TrainerView& trainer, bool epoch_end) {
  if (options_.save_top_k() == 0) return;
  TopKDecision decision;
  if (trainer.is_global_zero()) {
    try {
      decision = decide_topk(trainer, monitor_candidates(trainer), epoch_end);
    } catch (const Error& e) {
      decision.error = e.what();
      decision.error_kind = e.kind();
      decision.exit_code = e.exit_code();
    } catch (const std::exception& e) {
      decision.error = "ModelCheckpoint could not choose the checkpoints to keep: " + message_of(e);
      decision.error_kind = ErrorKind::training;
      decision.exit_code = default_exit_code(ErrorKind::training);
    }
  }
  decision = share(trainer, std::move(decision));
  if (!decision.error.empty()) {
    if (decision.error_kind == ErrorKind::usage) throw UsageError(decision.error);
    throw Error(decision.error_kind, decision.error, decision.exit_code);
  }
  if (!decision.save.empty()) save(trainer, decision.save);
  if (!decision.remove.empty() && trainer.is_global_zero()) remove(trainer, decision.remove);
}

// Rank 0's decision and resulting state on every rank (rank 0 alone ran decide_topk).
ModelCheckpoint::TopKDecision ModelCheckpoint::share(TrainerView& trainer, TopKDecision decision) {
  if (trainer.world_size() == 1) return decision;
  c10::impl::GenericDict message(c10::StringType::get(), c10::AnyType::get());
  message.insert("error", decision.error);
  message.insert("error_kind", static_cast<int64_t>(decision.error_kind));
  message.insert("exit_code", static_cast<int64_t>(decision.exit_code));
  message.insert("save", decision.save);
  message.insert("remove", decision.remove);
  message.insert("state", state_dict());
  const auto shared = trainer.broadcast(c10::IValue(message), 0).toGenericDict();
  if (!trainer.is_global_zero()) apply_state(shared.at("state").toGenericDict());
  decision.error = shared.at("error").toStringRef();
  decision.error_kind = static_cast<ErrorKind>(shared.at("error_kind").toInt());
  decision.exit_code = static_cast<int>(shared.at("exit_code").toInt());
  decision.save = shared.at("save").toStringRef();
  decision.remove = shared.at("remove").toStringRef();
  return decision;
}

ModelCheckpoint::TopKDecision ModelCheckpoint::decide_topk(TrainerView& trainer,
                                                            const std::map<std::string, double>& candidates,
                                                            bool epoch_end) {
  if (options_.monitor().empty()) return decide_latest(candidates);
  TopKDecision decision;
  const auto found = candidates.find(options_.monitor());
  if (found == candidates.end()) {
    missing_monitor(trainer, candidates, epoch_end);
    return decision;
  }
  const double current = found->second;
  const bool min = options_.mode() == "min";
  if (!enters_top_k(current)) {
    if (options_.verbose()) {
      std::cerr << "Epoch " << trainer.current_epoch() << ", global step " << trainer.global_step() << ": '"
                << options_.monitor() << "' was not in top " << options_.save_top_k() << "\n";
    }
    return decision;
  }
  const int64_t k = options_.save_top_k() == -1 ? static_cast<int64_t>(best_k_models_.size()) + 1
                                                : options_.save_top_k();
  if (static_cast<int64_t>(best_k_models_.size()) == k) {
    decision.remove = kth_best_model_path_;
    best_k_models_.erase(std::find_if(best_k_models_.begin(), best_k_models_.end(),
                                      [&](const auto& entry) { return entry.first == kth_best_model_path_; }));
  }
  // A NaN is kept as the worst possible score, so that it is the first to go.
  const double inf = std::numeric_limits<double>::infinity();
  const double score = std::isnan(current) ? (min ? inf : -inf) : current;
  const std::string path = unused_path(candidates, decision.remove);
  current_score_ = score;
  auto same = std::find_if(best_k_models_.begin(), best_k_models_.end(),
                           [&](const auto& entry) { return entry.first == path; });
  if (same != best_k_models_.end()) {
    same->second = score;
  } else {
    best_k_models_.emplace_back(path, score);
  }
  rank_top_k(k);
  if (options_.verbose()) {
    char line[256];
    std::snprintf(line, sizeof line, "Epoch %lld, global step %lld: '%s' reached %0.5f (best %0.5f), saving model to ",
                  static_cast<long long>(trainer.current_epoch()), static_cast<long long>(trainer.global_step()),
                  options_.monitor().c_str(), current, *best_model_score_);
    std::cerr << line << "'" << path << "' as top " << k << "\n";
  }
  decision.save = path;
  if (decision.remove == path) decision.remove.clear();
  return decision;
}

// Without a monitor: the newest checkpoint is the best, and with save_top_k 1 it replaces the
// previous one.
ModelCheckpoint::TopKDecision ModelCheckpoint::decide_latest(const std::map<std::string, double>& candidates) {
  TopKDecision decision;
  const std::string previous = best_model_path_;
  best_model_path_ = unused_path(candidates, previous);
  decision.save = best_model_path_;
  // Only a file of this folder: after a resume, the previous run's checkpoints stay (Lightning).
  const bool ours = std::filesystem::path(previous).parent_path() == std::filesystem::path(dirpath_);
  if (options_.save_top_k() == 1 && ours && previous != best_model_path_) decision.remove = previous;
  return decision;
}

void ModelCheckpoint::rank_top_k(int64_t k) {
  // Ties go to the entry written first, as Python's min/max over a dict.
  const bool min = options_.mode() == "min";
  auto better = [min](double a, double b) { return min ? a < b : a > b; };
  if (static_cast<int64_t>(best_k_models_.size()) == k) {
    auto worst = best_k_models_.begin();
    for (auto it = best_k_models_.begin(); it != best_k_models_.end(); ++it) {
      if (better(worst->second, it->second)) worst = it;
    }
    kth_best_model_path_ = worst->first;
    kth_value_ = worst->second;
  }
  auto best = best_k_models_.begin();
  for (auto it = best_k_models_.begin(); it != best_k_models_.end(); ++it) {
    if (better(it->second, best->second)) best = it;
  }
  best_model_path_ = best->first;
  best_model_score_ = best->second;
}

bool ModelCheckpoint::enters_top_k(double current) const {
  if (options_.save_top_k() == -1) return true;
  if (static_cast<int64_t>(best_k_models_.size()) < options_.save_top_k() || !kth_value_) return true;
  return options_.mode() == "min" ? current < *kth_value_ : current > *kth_value_;  // NaN never enters
}

// The formatted name, with -v1, -v2, ... while a file of that name exists (other than the one
// this save replaces), so that an unrelated checkpoint is never overwritten.
std::string ModelCheckpoint::unused_path(const std::map<std::string, double>& candidates,
                                         const std::string& replaced) const {
  std::string path = format_checkpoint_name(candidates);
  for (int64_t version = 1; std::filesystem::exists(path) && path != replaced; ++version) {
    path = format_checkpoint_name(candidates, "", version);
  }
  return path;
}

void ModelCheckpoint::missing_monitor(TrainerView& trainer, const std::map<std::string, double>& candidates,
                                      bool epoch_end) {
  const std::string& monitor = options_.monitor();
  const std::string message = "ModelCheckpoint(monitor='" + monitor +
                              "') could not find the monitored key in the returned metrics: " +
                              python_list(candidates) + ". HINT: Did you call log('" + monitor +
                              "', value) in the TrainingModule?";
  // Before the first validation a validation metric cannot exist yet: only warn then. At an
  // epoch end where validation was due and did not run, there is none, so the name is wrong.
  const int64_t every = std::max<int64_t>(1, trainer.check_val_every_n_epoch());
  const bool validation_due = epoch_end && (trainer.current_epoch() + 1) % every == 0;
  if (validation_ran_ || validation_due) throw UsageError(message);
  if (!warned_missing_) std::cerr << "Warning: " << message << " Skipping this checkpoint.\n";
  warned_missing_ = true;
}

void ModelCheckpoint::save_last(TrainerView& trainer) {
  if (!options_.save_last()) return;
  std::string path = format_checkpoint_name(monitor_candidates(trainer), kLastFilename);
  if (trainer.world_size() > 1) path = trainer.broadcast(c10::IValue(path), 0).toStringRef();
  const std::string previous = last_model_path_;
  last_model_path_ = path;
  save(trainer, path);
  if (previous.empty() || previous == path || previous == best_model_path_ || !trainer.is_global_zero()) return;
  for (const auto& entry : best_k_models_) {
    if (entry.first == previous) return;
  }
  remove(trainer, previous);
}

c10::IValue ModelCheckpoint::state_dict() const {
  c10::impl::GenericDict state(c10::StringType::get(), c10::AnyType::get());
  state.insert("monitor", options_.monitor().empty() ? c10::IValue() : c10::IValue(options_.monitor()));
  state.insert("best_model_score", optional_value(best_model_score_));
  state.insert("best_model_path", best_model_path_);
  state.insert("current_score", optional_value(current_score_));
  state.insert("dirpath", dirpath_);
  c10::impl::GenericDict best_k(c10::StringType::get(), c10::AnyType::get());
  for (const auto& [path, score] : best_k_models_) best_k.insert(path, score);
  state.insert("best_k_models", best_k);
  state.insert("kth_best_model_path", kth_best_model_path_);
  state.insert("kth_value", optional_value(kth_value_));
  state.insert("last_model_path", last_model_path_);
  return state;
}

void ModelCheckpoint::load_state_dict(const c10::IValue& state) {
  if (!state.isGenericDict()) return;
  const auto dict = state.toGenericDict();
  apply_state(dict);
  loaded_dirpath_ = read_string(dict, "dirpath");
}

void ModelCheckpoint::apply_state(const c10::impl::GenericDict& state) {
  best_model_path_ = read_string(state, "best_model_path");
  best_model_score_ = read_score(state, "best_model_score");
  current_score_ = read_score(state, "current_score");
  best_k_models_.clear();
  if (state.contains("best_k_models") && state.at("best_k_models").isGenericDict()) {
    for (const auto& entry : state.at("best_k_models").toGenericDict()) {
      const auto score = read_score(entry.value());
      if (score) best_k_models_.emplace_back(entry.key().toStringRef(), *score);
    }
  }
  kth_best_model_path_ = read_string(state, "kth_best_model_path");
  kth_value_ = read_score(state, "kth_value");
  last_model_path_ = read_string(state, "last_model_path");
}

}  // namespace lockstep
