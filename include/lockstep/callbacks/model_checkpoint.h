#pragma once
/// ModelCheckpoint: saves checkpoints during fit and keeps the best k of them, as Lightning's
/// ModelCheckpoint does.

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <lockstep/callbacks/callback.h>
#include <lockstep/callbacks/model_checkpoint_options.h>

namespace lockstep {

/// Saves through `trainer.save_checkpoint` (rank 0 writes atomically, every rank calls it) at the
/// end of every `every_n_epochs`-th training epoch, after its validation, every
/// `every_n_train_steps` optimizer steps, or at the first step end `train_time_interval` seconds
/// after the previous such save (rank 0's clock decides; the ranks agree by one all-reduce of a
/// float per step, paid only with the interval set). With a `monitor`, a candidate enters the top k when it
/// beats the k-th best score (ties keep the older file); the file that falls out is deleted.
/// Without one, the newest checkpoint replaces the previous (save_top_k 1) or all are kept (-1).
/// Rank 0 decides and broadcasts its decision, so every rank saves the same files and holds the
/// same best_model_path even when the monitored value differs across ranks (no sync_dist).
/// State (best path and score, the top k, last.ckpt's path) is saved in checkpoints and
/// restored on resume.
///
///   auto checkpoint = std::make_shared<lockstep::ModelCheckpoint>(
///       lockstep::ModelCheckpointOptions().monitor("val_loss").save_top_k(2).save_last(true));
///   trainer.add_callback(checkpoint);
///   trainer.fit(model, train, val);
///   std::cout << checkpoint->best_model_path() << " " << *checkpoint->best_model_score() << "\n";
class ModelCheckpoint : public Callback {
 public:
  /// Throws UsageError for an invalid combination (save_top_k < -1, a mode other than min|max,
  /// save_top_k > 1 without a monitor, more than one of every_n_epochs, every_n_train_steps and
  /// train_time_interval set).
  explicit ModelCheckpoint(ModelCheckpointOptions options = {});

  /// "ModelCheckpoint{'monitor': 'val_loss', 'mode': 'min', 'every_n_train_steps': 0,
  /// 'every_n_epochs': 1}" (with ", 'train_time_interval': 1800.0" when that is set), so that
  /// several checkpoint callbacks keep separate state.
  std::string name() const override;

  void on_fit_start(TrainerView& trainer, TrainingModule& module) override;
  void on_fit_end(TrainerView& trainer, TrainingModule& module) override;
  void on_train_batch_end(TrainerView& trainer, TrainingModule& module, const torch::Tensor& loss,
                          int64_t batch_idx) override;
  void on_validation_end(TrainerView& trainer, TrainingModule& module) override;
  void on_train_epoch_end(TrainerView& trainer, TrainingModule& module) override;

  /// {"monitor", "best_model_score", "best_model_path", "current_score", "dirpath",
  /// "best_k_models" (path -> score), "kth_best_model_path", "kth_value", "last_model_path"}.
  c10::IValue state_dict() const override;
  /// Restores the best path and score; the top k and last.ckpt only when the checkpoint was
  /// written for the same dirpath (as Lightning), checked when fit starts.
  void load_state_dict(const c10::IValue& state) override;

  const ModelCheckpointOptions& options() const { return options_; }
  /// Where checkpoints go: the option, or `<log_dir>/checkpoints` once fit started.
  const std::string& dirpath() const { return dirpath_; }
  /// The best checkpoint so far by `monitor` (without one, the latest); "" before any.
  const std::string& best_model_path() const { return best_model_path_; }
  std::optional<double> best_model_score() const { return best_model_score_; }
  /// The latest monitored value that was saved.
  std::optional<double> current_score() const { return current_score_; }
  /// The kept checkpoints and their scores, in the order they were written.
  const std::vector<std::pair<std::string, double>>& best_k_models() const { return best_k_models_; }
  /// The worst of the top k, the next to be replaced; "" until there are k.
  const std::string& kth_best_model_path() const { return kth_best_model_path_; }
  const std::string& last_model_path() const { return last_model_path_; }

  /// The file a checkpoint with these values gets: `<dirpath>/<filename formatted>[-v<ver>].ckpt`.
  /// `metrics` should hold "epoch" and "step". Throws UsageError for a format spec it cannot apply.
  std::string format_checkpoint_name(const std::map<std::string, double>& metrics, const std::string& filename = "",
                                     int64_t version = 0) const;

 private:
  struct TopKDecision;
  std::map<std::string, double> monitor_candidates(TrainerView& trainer) const;
  void save_topk(TrainerView& trainer, bool epoch_end);
  TopKDecision decide_topk(TrainerView& trainer, const std::map<std::string, double>& candidates, bool epoch_end);
  TopKDecision decide_latest(const std::map<std::string, double>& candidates);
  /// After a score entered best_k_models_: the k-th best (once there are `k`) and the best.
  void rank_top_k(int64_t k);
  TopKDecision share(TrainerView& trainer, TopKDecision decision);
  void save_last(TrainerView& trainer);
  void save(TrainerView& trainer, const std::string& path);
  /// Removes a checkpoint and, with save_safetensors, the weights beside it (on rank 0).
  void remove(TrainerView& trainer, const std::string& path);
  bool skip_saving(TrainerView& trainer) const;
  /// Whether train_time_interval has passed, as rank 0 finds; every rank calls it at each batch end.
  bool train_time_due(TrainerView& trainer);
  bool enters_top_k(double current) const;
  std::string unused_path(const std::map<std::string, double>& candidates, const std::string& replaced) const;
  void missing_monitor(TrainerView& trainer, const std::map<std::string, double>& candidates, bool epoch_end);
  void apply_state(const c10::impl::GenericDict& state);

  ModelCheckpointOptions options_;
  int64_t every_n_epochs_;
  std::string dirpath_;
  bool fitting_ = false;
  bool validation_ran_ = false;
  bool warned_missing_ = false;
  int64_t last_global_step_saved_ = 0;
  int64_t last_step_timed_ = 0;  // the step train_time_due last looked at
  std::chrono::steady_clock::time_point last_time_checked_;

  std::string best_model_path_;
  std::optional<double> best_model_score_;
  std::optional<double> current_score_;
  std::vector<std::pair<std::string, double>> best_k_models_;
  std::string kth_best_model_path_;
  std::optional<double> kth_value_;
  std::string last_model_path_;
  std::optional<std::string> loaded_dirpath_;  // from load_state_dict, checked when fit starts
};

}  // namespace lockstep
