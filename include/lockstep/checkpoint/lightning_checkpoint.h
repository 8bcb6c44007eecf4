#pragma once
/// PyTorch Lightning's checkpoints (`.ckpt` files that `Trainer.fit` writes, Lightning 2.x), read
/// as a run to resume: the Trainer's `--ckpt-path` takes one as it takes its own.

#include <string>
#include <utility>
#include <vector>

#include <lockstep/checkpoint/checkpoint_io.h>
#include <lockstep/checkpoint/key_map.h>
#include <lockstep/core/optimizer_config.h>

namespace lockstep {
namespace checkpoint {

/// True when `checkpoint` was written by Lightning: it holds "pytorch-lightning_version" (both
/// the `pytorch_lightning` and the `lightning` packages write that key), whatever the file's name.
bool is_lightning_checkpoint(const Checkpoint& checkpoint);

/// A Lightning checkpoint in the Trainer's own layout, and what of it did not carry over.
struct LightningResume {
  /// "state_dict" (renamed to the module's names), "optimizer_states" (Python's layout, as the
  /// Trainer's own), "lr_schedulers" ({"epoch_steps", "step_steps", "plateau": each
  /// ReduceLROnPlateau's counters}), "epoch", "global_step",
  /// "loops" ({"next_epoch", "next_batch"}).
  Checkpoint checkpoint;
  /// One paragraph for the user: what was taken (weights, optimizer, schedulers' step counts,
  /// position) and every entry that does not carry over (callbacks' state, the loops' other
  /// counters, hyper_parameters, Python scheduler functions, ...), named.
  std::string note;
};

/// Maps the Lightning checkpoint `lightning` (read from `path`) onto a module whose state_dict
/// has the names and shapes `module_state` (in order) and onto the optimizers and schedulers of
/// `config`:
/// - weights by name: `rename`'s rules when given, else the one prefix rule that turns every
///   name of the file into one of the module's ("model.fc1.weight" -> "fc1.weight", or
///   "fc1.weight" -> "net.fc1.weight"); the shapes must match;
/// - each optimizer's state (Python's `optimizer.state_dict()`: per-parameter state by parameter
///   order, param groups' hyperparameters), when the file's optimizer is the one `config` has
///   (SGD, Adam, or AdamW: Adam with decoupled_weight_decay);
/// - each LR scheduler's step count (`last_epoch`), by position, counted per interval;
/// - the epoch and batch to continue from, as Lightning would (an epoch whose batches all ran
///   continues with the next), and the global step.
/// Throws UsageError naming `path`, the mismatch and the fix: other names or shapes, another
/// number or type of optimizers or schedulers, an optimizer Lockstep lacks.
LightningResume from_lightning_checkpoint(const Checkpoint& lightning,
                                          const std::vector<std::pair<std::string, std::vector<int64_t>>>& module_state,
                                          const OptimizerConfig& config, const KeyMap& rename, const std::string& path);

}  // namespace checkpoint
}  // namespace lockstep
