#pragma once
// What trainer.cpp, loops.cpp and checkpointing.cpp share: the Trainer's own helpers, not installed.

#include <iostream>
#include <optional>
#include <string>
#include <utility>

#include <torch/torch.h>

#include <lockstep/core/error.h>
#include <lockstep/trainer/trainer.h>

namespace lockstep {
namespace detail {

/// Batch `i` of an evaluation or predict loader without the sampler's repeats, and how many of
/// its examples count. A batch of repeats only stays whole and counts none: every rank still
/// runs as many steps.
struct EvaluationBatch {
  Batch batch;
  int64_t counted;
};
EvaluationBatch evaluation_batch(DataLoader& loader, int64_t i);

}  // namespace detail

/// Validation, test and predict run under InferenceMode, or NoGradGuard with --inference-mode
/// false (Lightning's _evaluation_context).
class EvaluationGuard {
 public:
  explicit EvaluationGuard(bool inference_mode) {
    if (inference_mode) {
      inference_.emplace();
    } else {
      no_grad_.emplace();
    }
  }

 private:
  std::optional<c10::InferenceMode> inference_;
  std::optional<torch::NoGradGuard> no_grad_;
};

/// Tells a profiler (when there is one) that `stage` begins, and that it ended when end() is
/// called or this goes, by an exception too: a trace of the batches before a failure is kept.
class ProfiledStage {
 public:
  ProfiledStage(Profiler* profiler, std::string stage, int global_rank, const std::string& log_dir)
      : profiler_(profiler), stage_(std::move(stage)) {
    if (profiler_ != nullptr) profiler_->setup(stage_, global_rank, log_dir);
  }
  ProfiledStage(const ProfiledStage&) = delete;
  ProfiledStage& operator=(const ProfiledStage&) = delete;
  ~ProfiledStage() {
    try {
      end();
    } catch (const std::exception& e) {  // the error that ended the stage matters more
      std::cerr << "lockstep: warning: the profiler did not end " << stage_ << ": " << e.what() << "\n";
    }
  }
  void end() {
    if (auto* profiler = std::exchange(profiler_, nullptr)) profiler->teardown(stage_);
  }

 private:
  Profiler* profiler_;
  std::string stage_;
};

/// --overfit-batches is on (a count or fraction above 0).
bool overfitting(const TrainerOptions& options);

template <typename Fn>
void Trainer::each_callback(const char* hook, Fn&& fn) {
  for (auto& callback : callbacks_) {
    if (!profiler_) {
      fn(*callback);
      continue;
    }
    auto timed = profile("[Callback]" + callback->name() + "." + hook);
    fn(*callback);
  }
}

}  // namespace lockstep
