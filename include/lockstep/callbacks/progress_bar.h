#pragma once
/// ProgressBar: training progress on rank 0, on stderr (stdout keeps the machine-readable lines).

#include <chrono>
#include <map>
#include <string>

#include <lockstep/callbacks/callback.h>
#include <lockstep/callbacks/progress_bar_options.h>

namespace lockstep {

/// On a terminal, a live bar in the style of Lightning's TQDMProgressBar, redrawn in place:
///   Epoch 2:  45%|#########           | 9/20 [00:01<00:01, 8.53it/s, train_loss=0.123]
/// ending each epoch with all its metrics (validation included). Elsewhere (a log file, a batch
/// job), plain lines every print_every_percent of an epoch, and one line per epoch:
///   Epoch 2:  50% 10/20 [00:01<00:01, 8.53it/s, train_loss=0.123]
///   Epoch 2 done: 20 batches in 00:02 (8.53it/s); train_loss=0.123, val_loss=0.456
/// Progress shows the metrics logged with prog_bar(true); the epoch line shows every metric, one
/// logged on_step only (train_loss by default) as its mean over the epoch.
/// Only global rank 0 writes. The Trainer adds one when enable_progress_bar is true.
class ProgressBar : public Callback {
 public:
  explicit ProgressBar(ProgressBarOptions options = {});

  std::string name() const override { return "ProgressBar"; }
  void on_fit_start(TrainerView& trainer, TrainingModule& module) override;
  void on_fit_end(TrainerView& trainer, TrainingModule& module) override;
  void on_train_epoch_start(TrainerView& trainer, TrainingModule& module) override;
  void on_train_batch_end(TrainerView& trainer, TrainingModule& module, const torch::Tensor& loss,
                          int64_t batch_idx) override;
  void on_validation_start(TrainerView& trainer, TrainingModule& module) override;
  void on_validation_batch_end(TrainerView& trainer, TrainingModule& module, int64_t batch_idx) override;
  void on_validation_end(TrainerView& trainer, TrainingModule& module) override;
  void on_train_epoch_end(TrainerView& trainer, TrainingModule& module) override;

  /// Whether it draws a live bar (the option, or whether stderr is a terminal).
  bool live() const { return live_; }

 private:
  using Clock = std::chrono::steady_clock;
  /// "Epoch 2:  45%|####      | 9/20 [00:01<00:01, 8.53it/s, train_loss=0.123]" (live) or
  /// the same without the bar (plain).
  std::string progress(const std::string& label, int64_t done, int64_t total, Clock::time_point start,
                       const std::map<std::string, double>& metrics) const;
  bool plain_line_due(int64_t done, int64_t total) const;
  /// Redraws the live line (at most every refresh_seconds unless `force`); `final` ends it.
  void draw(const std::string& text, bool force, bool final);
  void write(const std::string& text);

  ProgressBarOptions options_;
  bool live_;
  bool fitting_ = false;
  Clock::time_point epoch_start_;
  Clock::time_point validation_start_;
  Clock::time_point last_draw_;
  int64_t batches_done_ = 0;
  size_t drawn_width_ = 0;  // of the live line now on screen, to blank what a shorter one leaves
};

}  // namespace lockstep
