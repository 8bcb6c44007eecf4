// The Trainer's checkpoints: the state it saves, save_checkpoint, resuming from --ckpt-path
// (checked before anything is created, "last" found, the origin recorded, the state restored),
// and the weights of --init-weights.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <mutex>

#include <torch/torch.h>

#include <lockstep/checkpoint/checkpoint_io.h>
#include <lockstep/checkpoint/dcp_checkpoint.h>
#include <lockstep/checkpoint/hyper_parameters.h>
#include <lockstep/checkpoint/key_map.h>
#include <lockstep/checkpoint/lightning_checkpoint.h>
#include <lockstep/checkpoint/optimizer_state.h>
#include <lockstep/checkpoint/safetensors.h>
#include <lockstep/checkpoint/sharded_checkpoint.h>
#include <lockstep/checkpoint/state_dict.h>
#include <lockstep/core/error.h>
#include <lockstep/launchers/launcher.h>
#include <lockstep/loggers/logger_options.h>
#include <lockstep/trainer/trainer.h>

#include "elastic_run.h"
#include "trainer_internal.h"

namespace lockstep {
namespace {

// `--ckpt-path last`: the newest version_N/checkpoints/last.ckpt in the folder of the runs
// (as Lightning's "last" finds the latest run's), or "" when no run saved one.
std::string find_last_checkpoint(const std::filesystem::path& runs) {
  std::string best;
  int64_t best_version = -1;
  std::error_code ignored;
  for (const auto& entry : std::filesystem::directory_iterator(runs, ignored)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("version_", 0) != 0) continue;
    const auto candidate = entry.path() / "checkpoints" / "last.ckpt";
    int64_t version = -1;
    try {
      version = std::stoll(name.substr(8));
    } catch (const std::exception&) {
      continue;
    }
    if (version > best_version && std::filesystem::exists(candidate)) {
      best_version = version;
      best = candidate.string();
    }
  }
  return best;  // "" when there is none
}

c10::IValue rng_state() {
  auto generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

// A state_dict alone is weights to start from, not a run to resume; a checkpoint lacking one of
// the keys a run needs is refused by name.
void check_resumable(const checkpoint::Checkpoint& ckpt, const std::string& path) {
  const bool weights_only = !ckpt.contains("state_dict") && ckpt.size() > 0 &&
                            std::all_of(ckpt.begin(), ckpt.end(), [](const auto& entry) { return entry.value().isTensor(); });
  LOCKSTEP_CHECK(!weights_only, UsageError, "--ckpt-path ", path, " holds only tensors by name (a state_dict, as ",
                 "torch.save(model.state_dict(), path) writes), not a run to resume. To start from these weights, use ",
                 "--init-weights ", path, " instead.");
  checkpoint::require_keys(ckpt, {"state_dict", "optimizer_states", "epoch", "global_step", "loops"}, path);
}

// Runs `read`, which takes `key` of the checkpoint at `path`. A checkpoint of something else may
// have the keys but not their contents: LibTorch's type errors become one message naming the key
// and what it should hold.
void read_entry(const std::string& path, const char* key, const char* expected, const std::function<void()>& read) {
  try {
    read();
  } catch (const UsageError& e) {
    throw UsageError("checkpoint '" + path + "': " + message_of(e));
  } catch (const c10::Error& e) {
    const std::string why = e.what_without_backtrace();
    throw UsageError("checkpoint '" + path + "': \"" + key + "\" should hold " + expected + " (" +
                     why.substr(0, why.find('\n')) + "). It is not a checkpoint of this Trainer; pass one it " +
                     "wrote (--ckpt-path PATH, or --ckpt-path last).");
  }
}

// --ckpt-path-rename applies to a Lightning checkpoint's names; the Trainer's own are the module's.
void check_rename_applies(const std::string& rename, const std::string& path, bool lightning) {
  LOCKSTEP_CHECK(rename.empty() || lightning, UsageError, "--ckpt-path-rename ", rename, " renames the names of a ",
                 "Lightning checkpoint, and --ckpt-path ", path, " is ", path == "last" ? "this Trainer's newest" :
                 "this Trainer's own checkpoint", ", whose names are the module's. Drop --ckpt-path-rename.");
}

// A mismatch every rank finds alike (the same file, the same module): rank 0 reports it, so that
// cli::guarded_main prints it once for the job.
class MismatchOnEveryRank : public UsageError {
 public:
  MismatchOnEveryRank(const std::string& message, bool report_here) : UsageError(message) {
    set_report_here(report_here);
  }
};

// What to do about a checkpoint whose weights do not match the module: the Trainer's flags.
std::string resume_mismatch(const std::string& path, const checkpoint::StateDictCheck& check) {
  const std::string message = "--ckpt-path " + path + ": the checkpoint does not match the model (" + check.mismatch +
                              "). ";
  if (!check.rename_from.empty() || !check.rename_to.empty()) {
    return message + "Its names differ from the module's by a prefix: it was saved from another module. Resume with "
                     "the module it was saved from, or start a new run from its weights with --init-weights " + path +
           " --init-weights-rename '" + check.rename_from + "=" + check.rename_to + "'.";
  }
  if (check.only_names) {
    return message + "A resume needs every name: resume with the module it was saved from, or start a new run "
                     "from the weights whose names match with --init-weights " + path +
           " --init-weights-strict false (no optimizer state; epoch 0).";
  }
  return message + "It was saved from a model of other sizes: resume with the module it was saved from, or pass a "
                   "checkpoint of this one (no flag skips a shape mismatch).";
}

std::string init_weights_mismatch(const std::string& path, const checkpoint::StateDictCheck& check) {
  const std::string message = "--init-weights " + path + ": the weights do not match the model (" + check.mismatch +
                              "). ";
  if (!check.rename_from.empty() || !check.rename_to.empty()) {
    return message + "Their names differ from the module's by a prefix: map them with --init-weights-rename '" +
           check.rename_from + "=" + check.rename_to + "'.";
  }
  if (check.only_names) {
    return message + "Skip the missing and unexpected names with --init-weights-strict false, or pass weights of "
                     "this module.";
  }
  return message + "They were saved from a model of other sizes: build the module with the file's sizes, or pass "
                   "weights of this module (no flag skips a shape mismatch).";
}

// A resumed run keeps the module's own hparams, as Lightning's fit(ckpt_path=...) does; those
// that differ from the checkpoint's are named once, so that a changed --lr is no surprise.
void note_changed_hparams(const nlohmann::json& saved, const nlohmann::json& own, const std::string& path) {
  const auto text = [](const nlohmann::json& object, const std::string& key) {
    return object.contains(key) ? object.at(key).dump() : std::string("unset");
  };
  std::string changed;
  auto keys = saved;
  keys.update(own);
  for (const auto& [key, ignored] : keys.items()) {
    if (saved.contains(key) && own.contains(key) && saved.at(key) == own.at(key)) continue;
    changed += (changed.empty() ? "" : ", ") + key + " " + text(saved, key) + " -> " + text(own, key);
  }
  if (changed.empty()) return;
  std::cerr << "lockstep: the module's hparams differ from those saved in " << path << ": " << changed
            << "; the run goes on with the module's (they are logged and saved).\n";
}

}  // namespace

void Trainer::check_weights_match(const torch::nn::Module& module) const {
  // Before launch, as the files were read: a mismatch is one message, once, from one process.
  if (init_weights_) {
    const auto keys = checkpoint::KeyMap::parse(options_.init_weights_rename());
    const auto check = checkpoint::check_state_dict(module, keys.apply(*init_weights_), options_.init_weights_strict());
    if (!check.mismatch.empty()) throw UsageError(init_weights_mismatch(options_.init_weights(), check));
  }
  if (!early_checkpoint_ || checkpoint::is_lightning_checkpoint(*early_checkpoint_)) return;
  const auto& ckpt = *early_checkpoint_;
  if (!ckpt.contains("state_dict") || !ckpt.at("state_dict").isGenericDict()) return;  // refused in restore()
  const auto check = checkpoint::check_state_dict(module, ckpt.at("state_dict").toGenericDict());
  if (!check.mismatch.empty()) throw UsageError(resume_mismatch(options_.ckpt_path(), check));
}

c10::impl::GenericDict Trainer::checkpoint_state() const {
  auto ckpt = checkpoint::make_checkpoint();
  ckpt.insert("state_dict", plan_.strategy->module_state_dict(*module_));
  c10::impl::GenericList optimizers(c10::AnyType::get());
  for (const auto& o : optimizer_config_.optimizers) optimizers.push_back(plan_.strategy->optimizer_state_dict(*o));
  ckpt.insert("optimizer_states", optimizers);
  c10::impl::GenericDict schedulers(c10::StringType::get(), c10::AnyType::get());
  schedulers.insert("epoch_steps", scheduler_epoch_steps_);
  schedulers.insert("step_steps", scheduler_step_steps_);
  schedulers.insert("plateau", plateau_states());
  ckpt.insert("lr_schedulers", schedulers);
  ckpt.insert("epoch", current_epoch_);
  ckpt.insert("global_step", global_step_);
  c10::impl::GenericDict loops(c10::StringType::get(), c10::AnyType::get());
  loops.insert("next_epoch", epoch_completed_ ? current_epoch_ + 1 : current_epoch_);
  // Mid-epoch: the batches of this epoch already trained on (the sampler's order is the epoch's).
  loops.insert("next_batch", epoch_completed_ ? int64_t{0} : batches_done_);
  // Whose batches next_batch counts: a job re-formed at another size finds its place in the epoch.
  loops.insert("world_size", static_cast<int64_t>(plan_.strategy->world_size()));
  loops.insert("epoch_batches", num_training_batches_);
  ckpt.insert("loops", loops);
  c10::impl::GenericDict callbacks(c10::StringType::get(), c10::AnyType::get());
  for (const auto& c : callbacks_) callbacks.insert(c->name(), c->state_dict());
  ckpt.insert("callbacks", callbacks);
  ckpt.insert("rng_state", rng_state());
  if (scaler_) ckpt.insert("native_amp_scaling_state", scaler_->state_dict());  // Lightning's key
  ckpt.insert("hyper_parameters", checkpoint::hyper_parameters_value(module_->hparams()));
  ckpt.insert("lockstep_version", std::string("0.1.0"));
  // Where it came from: a run resumed from it links back, so its curves can be drawn as one.
  ckpt.insert("log_dir", std::filesystem::absolute(log_dir_).string());
  return ckpt;
}

std::vector<std::pair<std::string, torch::Tensor>> Trainer::local_weights() {
  LOCKSTEP_CHECK(module_ != nullptr, UsageError, "Trainer::local_weights: no module is set up yet; call it from a "
                 "callback hook during fit, validate, test or predict.");
  return plan_.strategy->local_weights(*module_);
}

void Trainer::load_local_weights(const std::map<std::string, torch::Tensor>& values) {
  LOCKSTEP_CHECK(module_ != nullptr, UsageError, "Trainer::load_local_weights: no module is set up yet; call it "
                 "from a callback hook during fit, validate, test or predict.");
  plan_.strategy->load_local_weights(*module_, values);
}

namespace {

std::map<std::string, torch::Tensor> cloned(const std::vector<std::pair<std::string, torch::Tensor>>& weights) {
  std::map<std::string, torch::Tensor> copy;
  for (const auto& [name, tensor] : weights) copy.emplace(name, tensor.clone());
  return copy;
}

}  // namespace

// Both ways go through the module: `values` stand in for its weights while the strategy's own
// hooks (those of the checkpoint's state_dict) lay them out, then its weights come back.
c10::Dict<std::string, torch::Tensor> Trainer::checkpoint_weights(const std::map<std::string, torch::Tensor>& values) {
  const auto kept = cloned(local_weights());
  load_local_weights(values);
  c10::Dict<std::string, torch::Tensor> state;
  for (const auto& item : plan_.strategy->module_state_dict(*module_)) {
    if (values.count(item.key())) state.insert(item.key(), item.value().clone());
  }
  load_local_weights(kept);
  return state;
}

std::map<std::string, torch::Tensor> Trainer::local_weights_of(const c10::impl::GenericDict& state) {
  const auto kept = cloned(local_weights());
  plan_.strategy->load_module_state_dict(*module_, state, /*strict=*/false);
  std::map<std::string, torch::Tensor> values;
  for (auto& [name, tensor] : cloned(local_weights())) {
    if (state.contains(name)) values.emplace(name, std::move(tensor));
  }
  load_local_weights(kept);
  return values;
}

void Trainer::save_checkpoint(const std::string& path) {
  auto timed = profile("save_checkpoint");
  if (checkpoint::is_safetensors_path(path)) {  // the weights alone (Lightning's weights_only)
    plan_.strategy->save_safetensors(*module_, path);
    return;
  }
  // A sharded strategy collects the state on every rank: rank 0 writes it whole, or every rank
  // its pieces (a sharded checkpoint directory).
  if (plan_.strategy->shards_state() || plan_.strategy->is_global_zero()) {
    plan_.strategy->save_checkpoint(checkpoint_state(), path, *checkpoint_io_, optimizer_config_.optimizers);
  }
  plan_.strategy->barrier("save_checkpoint");
}

bool Trainer::save_checkpoint_alone(const std::string& path) {
  LOCKSTEP_CHECK(!checkpoint::is_safetensors_path(path), UsageError, "save_checkpoint_alone(", path, "): a ",
                 "safetensors file is written by every rank together; save a .ckpt path.");
  if (!plan_.strategy || plan_.strategy->shards_state() || plan_.strategy->saves_pieces()) return false;
  auto timed = profile("save_checkpoint");
  // Within gradient accumulation the gradients gathered so far are not saved; the weights have not
  // changed since the window began, so the checkpoint resumes at its first batch.
  const int64_t batches = std::exchange(batches_done_, step_boundary_batch_);
  auto state = checkpoint_state();
  batches_done_ = batches;
  checkpoint_io_->save(state, path);
  return true;
}

std::string Trainer::why_nothing_trained(int64_t epoch, int64_t max_epochs) const {
  const std::string from = options_.ckpt_path().empty()
                               ? ""
                               : "the checkpoint (--ckpt-path " + options_.ckpt_path() + ") ends at epoch " +
                                     std::to_string(epoch) + ", step " + std::to_string(global_step_) + ", which ";
  if (epoch >= max_epochs) {
    return (from.empty() ? std::string("") : from + "already reaches ") + "--max-epochs " +
           std::to_string(options_.max_epochs()) + ". Raise --max-epochs to train.";
  }
  if (options_.max_steps() >= 0 && global_step_ >= options_.max_steps()) {
    return (from.empty() ? std::string("") : from + "already reaches ") + "--max-steps " +
           std::to_string(options_.max_steps()) + ". Raise --max-steps to train.";
  }
  return "the loader gave no training batch (--limit-train-batches " + options_.limit_train_batches().str() +
         ", " + std::to_string(num_training_batches_) + " batch(es)). Check the dataset and the limit.";
}

void Trainer::record_resume(const std::string& path, const std::string& origin) const {
  if (!plan_.strategy->is_global_zero()) return;
  const auto here = std::filesystem::absolute(log_dir_);
  std::cerr << "lockstep: resuming from " << path << " (epoch " << current_epoch_ << ", step " << global_step_
            << "); this run writes its logs and checkpoints to " << here.string();
  if (!origin.empty() && std::filesystem::path(origin) != here) {
    // `lockstep plot` follows this link to draw the runs as one.
    std::error_code ignored;
    std::filesystem::create_directories(here, ignored);
    std::ofstream(here / "resumed_from") << origin << "\n";
    std::cerr << " (the run it resumes wrote to " << origin << "; `lockstep plot " << here.string()
              << "` draws both)";
  }
  std::cerr << ".\n";
}

void Trainer::check_resume_source() {
  // Before a run folder is made or a rank launched, so that a bad path is one message, once.
  const std::string& path = options_.ckpt_path();
  try {
    checkpoint::KeyMap::parse(options_.ckpt_path_rename());
  } catch (const UsageError& e) {
    throw UsageError("--ckpt-path-rename: " + message_of(e));
  }
  if (path.empty()) return;
  if (path != "last") {
    // A sharded directory: its metadata now, each rank's pieces in restore().
    if (checkpoint::is_sharded_checkpoint(path)) {
      checkpoint::read_sharded_metadata(path);
      check_rename_applies(options_.ckpt_path_rename(), path, false);
      return;
    }
    if (checkpoint::is_dcp_checkpoint(path)) {  // a DCP folder, read as the sharded one
      checkpoint::read_dcp_tensors(path);
      return;
    }
    early_checkpoint_ = checkpoint_io_->load(path);  // restore() uses it: one read
    check_rename_applies(options_.ckpt_path_rename(), path, checkpoint::is_lightning_checkpoint(*early_checkpoint_));
    return;
  }
  check_rename_applies(options_.ckpt_path_rename(), path, false);
  // "last" is looked for in restore(), beside this run's folder (a user's logger may keep its runs
  // elsewhere): a first run, or one restarted before it saved, finds none and starts afresh.
}

void Trainer::check_init_weights_source() {
  // Read before a rank is launched, as --ckpt-path: a bad file or rule is one message, once.
  try {
    checkpoint::KeyMap::parse(options_.init_weights_rename());
  } catch (const UsageError& e) {
    throw UsageError("--init-weights-rename: " + message_of(e));
  }
  const std::string& path = options_.init_weights();
  if (path.empty()) return;
  const std::string flag = "--init-weights " + path + ": ";
  std::error_code ignored;
  if (!std::filesystem::is_regular_file(path, ignored)) {
    throw UsageError(flag + "no such file. Pass the file that Python's torch.save(model.state_dict(), path) wrote, "
                     "or a checkpoint.");
  }
  try {
    const auto file = checkpoint_io_->load(path);
    // A checkpoint (Lockstep's or Lightning's: a "state_dict" dict beside the loop's state, an
    // rng_state tensor among it) gives its weights; a module has no parameter that is a dict.
    const bool nested = file.contains("state_dict") && file.at("state_dict").isGenericDict();
    init_weights_ = nested ? file.at("state_dict").toGenericDict() : file;
  } catch (const UsageError& e) {
    throw UsageError(flag + message_of(e));
  }
}

void Trainer::load_init_weights() {
  if (!init_weights_) return;
  const std::string flag = "--init-weights " + options_.init_weights() + ": ";
  const auto keys = checkpoint::KeyMap::parse(options_.init_weights_rename());
  const auto state = keys.apply(*init_weights_);
  const auto check = checkpoint::check_state_dict(*module_, state, options_.init_weights_strict());
  if (!check.mismatch.empty()) throw UsageError(init_weights_mismatch(options_.init_weights(), check));
  const auto result = checkpoint::load_state_dict(*module_, state, options_.init_weights_strict());
  init_weights_.reset();
  if (!plan_.strategy->is_global_zero()) return;
  if (!result.missing_keys.empty() || !result.unexpected_keys.empty()) {
    std::cerr << "lockstep: " << flag << "--init-weights-strict false left " << result.missing_keys.size()
              << " of the module's names at their initial values and skipped " << result.unexpected_keys.size()
              << " names of the file.\n";
  }
}

std::string Trainer::last_checkpoint() const {
  // This run has a new version folder: the newest last.ckpt beside it.
  const auto runs = std::filesystem::path(log_dir_).parent_path();
  const std::string path = find_last_checkpoint(runs);
  // As Lightning's ckpt_path="last": a note, and training from the start (the first attempt of a
  // job that is restarted with --ckpt-path last).
  if (path.empty() && plan_.strategy->is_global_zero()) {
    std::cerr << "lockstep: --ckpt-path last: no version_N/checkpoints/last.ckpt under " << runs.string()
              << " yet; training from the start.\n";
  }
  return path;
}

std::optional<int64_t> Trainer::continued_version() const {
  if (options_.ckpt_path() != "last" || !detail::under_restarting_launcher()) return std::nullopt;
  const auto runs = std::filesystem::path(options_.default_root_dir()) / loggers::LoggerOptions("").name();
  const auto version = detail::version_with_last_checkpoint(runs.string());
  if (!version || !detail::made_by_this_job((runs / ("version_" + std::to_string(*version))).string())) {
    return std::nullopt;
  }
  return version;
}

void Trainer::start_attempt_record(bool resumed) {
  if (!plan_.strategy->is_global_zero() || !detail::under_restarting_launcher()) return;
  const int world = plan_.strategy->world_size();
  if (const auto before = detail::read_attempt_progress(log_dir_)) {
    std::cerr << detail::membership_line(*before, world, resumed ? resumed_path_ : "", resumed ? global_step_ : 0);
  }
  attempt_record_ = std::make_unique<detail::AttemptRecord>(log_dir_, world, global_step_);
}

void Trainer::restore_loops(const c10::impl::GenericDict& loops) {
  current_epoch_ = loops.at("next_epoch").toInt();
  resume_batch_ = loops.contains("next_batch") ? loops.at("next_batch").toInt() : 0;
  // Saved within an epoch at another world size (an elastic job re-formed): the same place in
  // the epoch's order of examples, at this size's batches.
  if (loops.contains("world_size") && loops.contains("epoch_batches")) {
    resume_batch_ = detail::next_batch_at(resume_batch_, static_cast<int>(loops.at("world_size").toInt()),
                                          loops.at("epoch_batches").toInt(), plan_.strategy->world_size(),
                                          num_training_batches_);
  }
}

bool Trainer::restore(const std::string& ckpt_path) {
  std::string path = ckpt_path;
  if (path == "last") {
    path = last_checkpoint();
    if (path.empty()) return false;
  }
  resumed_path_ = path;
  auto ckpt = early_checkpoint_ && path == options_.ckpt_path()
                  ? *early_checkpoint_
                  : plan_.strategy->load_checkpoint(path, *checkpoint_io_, optimizer_config_.optimizers);
  early_checkpoint_.reset();
  if (checkpoint::is_lightning_checkpoint(ckpt)) ckpt = from_lightning(ckpt, path);
  check_resumable(ckpt, path);
  // --ckpt-path last, or a file not read before launch: the same fix, from every rank. A sharded
  // module's names and sizes are only known by gathering it: its strategy checks them itself.
  if (!plan_.strategy->shards_state() && ckpt.at("state_dict").isGenericDict()) {
    const auto check = checkpoint::check_state_dict(*module_, ckpt.at("state_dict").toGenericDict());
    if (!check.mismatch.empty()) {
      launchers::expect_launched_job_exit(2);  // the other ranks' exit code 2 is this, not a new failure
      throw MismatchOnEveryRank(resume_mismatch(path, check), plan_.strategy->is_global_zero());
    }
  }
  read_entry(path, "state_dict", "a dict of parameter and buffer names to tensors",
             [&] { plan_.strategy->load_module_state_dict(*module_, ckpt.at("state_dict").toGenericDict()); });
  restore_optimizers(ckpt, path);
  read_entry(path, "loops", "a dict with the integer next_epoch (and next_batch)",
             [&] { restore_loops(ckpt.at("loops").toGenericDict()); });
  read_entry(path, "global_step", "an integer", [&] { global_step_ = ckpt.at("global_step").toInt(); });
  record_resume(path, ckpt.contains("log_dir") && ckpt.at("log_dir").isString() ? ckpt.at("log_dir").toStringRef() : "");
  if (ckpt.contains("hyper_parameters") && plan_.strategy->is_global_zero()) {
    note_changed_hparams(checkpoint::hparams_of(ckpt), module_->hparams(), path);
  }
  if (ckpt.contains("callbacks")) {
    read_entry(path, "callbacks", "a dict of callback names to their states", [&] {
      const auto states = ckpt.at("callbacks").toGenericDict();
      for (auto& c : callbacks_) {
        if (states.contains(c->name())) c->load_state_dict(states.at(c->name()));
      }
    });
  }
  // A checkpoint of a run without loss scaling starts the scaler afresh, as Lightning does.
  if (scaler_ && ckpt.contains("native_amp_scaling_state")) {
    read_entry(path, "native_amp_scaling_state", "the loss scaler's state (a dict)",
               [&] { scaler_->load_state_dict(ckpt.at("native_amp_scaling_state").toGenericDict()); });
  }
  if (ckpt.contains("rng_state")) {
    read_entry(path, "rng_state", "the CPU generator's state (a byte tensor)", [&] {
      auto generator = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_state(ckpt.at("rng_state").toTensor());
    });
  }
  return true;
}

checkpoint::Checkpoint Trainer::from_lightning(const checkpoint::Checkpoint& ckpt, const std::string& path) const {
  // A sharding strategy's state_dict holds each rank's pieces, and Lightning's file whole tensors.
  LOCKSTEP_CHECK(!plan_.strategy->saves_pieces(), UsageError, "--ckpt-path ", path, " is a Lightning checkpoint of ",
                 "whole tensors, and --fsdp-state-dict-type sharded restores pieces. Resume it with ",
                 "--fsdp-state-dict-type full.");
  std::vector<std::pair<std::string, std::vector<int64_t>>> names;
  for (const auto& entry : plan_.strategy->module_state_dict(*module_)) {
    names.emplace_back(entry.key(), entry.value().sizes().vec());
  }
  auto resume = checkpoint::from_lightning_checkpoint(ckpt, names, optimizer_config_,
                                                      checkpoint::KeyMap::parse(options_.ckpt_path_rename()), path);
  // One note, once: what carried over and what did not.
  if (plan_.strategy->is_global_zero()) std::cerr << "lockstep: " << resume.note << "\n";
  return resume.checkpoint;
}

void Trainer::restore_optimizers(const checkpoint::Checkpoint& ckpt, const std::string& path) {
  c10::impl::GenericList optimizers(c10::AnyType::get());
  read_entry(path, "optimizer_states", "a list of optimizer state dicts",
             [&] { optimizers = ckpt.at("optimizer_states").toList(); });
  if (optimizers.size() != optimizer_config_.optimizers.size()) {
    throw UsageError("--ckpt-path " + path + " holds " + std::to_string(optimizers.size()) +
                     " optimizer state(s) but configure_optimizers returned " +
                     std::to_string(optimizer_config_.optimizers.size()) + "; resume with the same model code.");
  }
  // Schedulers first: replaying their steps moves the learning rates, which the optimizer
  // states then set to the saved values exactly.
  if (ckpt.contains("lr_schedulers")) {
    read_entry(path, "lr_schedulers", "a dict with integers epoch_steps and step_steps",
               [&] { restore_schedulers(ckpt.at("lr_schedulers").toGenericDict(), path); });
  }
  read_entry(path, "optimizer_states", "a list of optimizer state dicts", [&] {
    for (size_t i = 0; i < optimizers.size(); ++i) {
      plan_.strategy->load_optimizer_state_dict(*optimizer_config_.optimizers[i], optimizers.get(i).toGenericDict());
    }
  });
}

}  // namespace lockstep
