#pragma once
/// Tuner: Lightning's `lightning.pytorch.tuner.Tuner` for a Trainer: a learning-rate range test
/// (lr_find) and a batch-size search (scale_batch_size). Each runs training steps through the
/// Trainer's strategy, then puts the model's weights, the optimizer's state, the loop's counters
/// and the random generator back exactly as they were, and sets what it found.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <lockstep/data/data_loader.h>
#include <lockstep/trainer/trainer.h>
#include <lockstep/trainer/tuner_options.h>

namespace lockstep {

/// What the LR finder measured, one entry per optimizer step (Lightning's `lr_finder.results`).
struct LRFinder {
  /// Each step's learning rate.
  std::vector<double> lrs;
  /// Each step's loss, averaged over the ranks and then smoothed (running average, weight beta).
  std::vector<double> losses;
  /// How the learning rates grew: "exponential" or "linear" (LRFinderOptions::mode).
  std::string mode = "exponential";
  /// The index of Lightning's `suggestion()`: the steepest descent of the smoothed loss
  /// (torch.gradient's argmin) over the finite losses after the first `skip_begin` and before the
  /// last `skip_end`; nullopt when fewer than 2 points remain. The slope is taken against
  /// log10(lr) in exponential mode, the axis the curve is drawn on (Lightning 2.6 takes it
  /// against lr itself, which lets the noise between its tiny first rates win: Lightning issue
  /// #21141, fix proposed in pull request #21171), and against lr in linear mode.
  std::optional<size_t> suggestion_index(int64_t skip_begin = 10, int64_t skip_end = 1) const;
  /// The learning rate at suggestion_index(), or nullopt.
  std::optional<double> suggestion(int64_t skip_begin = 10, int64_t skip_end = 1) const;
  /// Writes the CSV that `lockstep plot` draws (log-x): "step,lr,loss,suggested", suggested 1 on
  /// the suggestion's row. Throws UsageError when `path` cannot be written.
  void write_csv(const std::string& path) const;
};

///   lockstep::Trainer trainer(options);
///   lockstep::Tuner tuner(trainer);
///   tuner.scale_batch_size(model, train);       // sets train's batch size
///   auto finder = tuner.lr_find(model, train);  // sets the optimizer's learning rate
///   trainer.fit(model, train, val);             // trains with both
/// On several ranks every rank runs the search with its share of each batch; a trial fails
/// when any rank runs out of memory, and the LR finder's loss is averaged over the ranks each
/// step, so every rank finds the same values.
class Tuner {
 public:
  explicit Tuner(Trainer& trainer) : trainer_(trainer) {}

  /// The learning-rate range test: options.num_training() optimizer steps from min_lr to max_lr
  /// on `train` (its epochs repeat when it is shorter), stopping early when the smoothed loss
  /// exceeds early_stop_threshold times the best (or is not finite). With update_lr the
  /// suggestion is set on every parameter group of the module's one optimizer. Refused (UsageError)
  /// with more than one optimizer, and skipped (an empty result) under --fast-dev-run.
  LRFinder lr_find(const std::shared_ptr<TrainingModule>& module, const std::shared_ptr<DataLoader>& train,
                   LRFinderOptions options = {});

  /// The batch-size search: trials of steps_per_trial optimizer steps, from init_val, doubling
  /// ("power") until a trial runs out of memory (c10::OutOfMemoryError, std::bad_alloc, or
  /// LibTorch's "not enough memory"), max_trials trials have run, or the size reaches the
  /// examples a rank reads per epoch or max_val; "binsearch" then bisects between the last size
  /// that ran and the first that did not. Sets the size found on `train` and returns it; the
  /// trials' training is undone. Skipped (the loader's size returned) under --fast-dev-run.
  int64_t scale_batch_size(const std::shared_ptr<TrainingModule>& module, const std::shared_ptr<DataLoader>& train,
                           BatchSizeFinderOptions options = {});

 private:
  friend class Trainer;  // --lr-find and --scale-batch-size run the searches inside fit
  /// The Trainer set up for `module`, and `train`'s sampler as fit puts it.
  void prepare(const std::shared_ptr<TrainingModule>& module, DataLoader& train);
  LRFinder find_lr(DataLoader& train, const LRFinderOptions& options);
  int64_t find_batch_size(DataLoader& train, const BatchSizeFinderOptions& options);
  /// steps_per_trial steps at batch size `size`; false when any rank ran out of memory.
  bool run_trial(DataLoader& train, int64_t size, int64_t steps);
  /// Rank 0's line about the finder's result.
  void report_lr(const LRFinder& finder, const LRFinderOptions& options) const;

  Trainer& trainer_;
};

}  // namespace lockstep
