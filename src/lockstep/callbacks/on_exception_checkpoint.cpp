#include <lockstep/callbacks/on_exception_checkpoint.h>

#include <filesystem>
#include <iostream>

#include <lockstep/core/error.h>

namespace lockstep {

OnExceptionCheckpoint::OnExceptionCheckpoint(std::string dirpath, std::string filename)
    : dirpath_(std::move(dirpath)), filename_(std::move(filename)) {
  LOCKSTEP_CHECK(!dirpath_.empty(), UsageError, "OnExceptionCheckpoint: dirpath is empty; name the folder to save ",
                 "in, e.g. OnExceptionCheckpoint(\"checkpoints\").");
  LOCKSTEP_CHECK(!filename_.empty() && filename_.find('/') == std::string::npos, UsageError,
                 "OnExceptionCheckpoint: filename '", filename_, "' must be a file name without '/' (\".ckpt\" is ",
                 "added), e.g. \"on_exception\"; put folders in dirpath.");
}

std::string OnExceptionCheckpoint::ckpt_path() const {
  return (std::filesystem::path(dirpath_) / (filename_ + ".ckpt")).string();
}

void OnExceptionCheckpoint::on_exception(TrainerView& trainer, TrainingModule& module, const std::exception& error) {
  if (trainer.fast_dev_run() > 0) return;  // --fast-dev-run writes no checkpoints
  const std::string path = ckpt_path();
  const std::string rank = "rank " + std::to_string(trainer.global_rank());
  if (!trainer.save_checkpoint_alone(path)) {
    std::cerr << "lockstep: OnExceptionCheckpoint (" << rank << "): not saved: the strategy holds the state in "
              << "pieces on every rank, and gathering them needs every rank, which a failing run cannot count on. "
              << "Continue from the last checkpoint ModelCheckpoint wrote (--ckpt-path last).\n";
    return;
  }
  std::cerr << "lockstep: OnExceptionCheckpoint (" << rank << "): fit failed at step " << trainer.global_step()
            << " (epoch " << trainer.current_epoch() << "); saved " << path << ". Continue with --ckpt-path " << path
            << " once the cause is fixed.\n";
}

}  // namespace lockstep
