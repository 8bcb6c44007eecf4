#pragma once
/// OnExceptionCheckpoint: when fit ends by an exception, saves `<dirpath>/<filename>.ckpt` of the
/// state at that moment before the exception goes on, as Lightning's OnExceptionCheckpoint does;
/// `--ckpt-path <dirpath>/<filename>.ckpt` continues from it.

#include <exception>
#include <string>

#include <lockstep/callbacks/callback.h>

namespace lockstep {

/// Several ranks: each rank that raised saves from its own state, with no collective (the other
/// ranks may be stuck in one or gone). Under DDP every rank holds the whole state, so the rank
/// that failed writes it even when rank 0 did not fail; ranks that failed together write the
/// same step's state, each atomically, to the same file. A strategy that shards the state (FSDP)
/// saves nothing and says so: gathering it needs every rank. A batch interrupted within
/// gradient accumulation resumes at the start of its accumulation window (the gradients
/// collected so far are not saved; the weights have not changed since).
///
///   trainer.add_callback(std::make_shared<lockstep::OnExceptionCheckpoint>("checkpoints"));
class OnExceptionCheckpoint : public Callback {
 public:
  /// Throws UsageError for an empty dirpath or filename, or a filename with a '/'.
  explicit OnExceptionCheckpoint(std::string dirpath, std::string filename = "on_exception");

  std::string name() const override { return "OnExceptionCheckpoint"; }
  void on_exception(TrainerView& trainer, TrainingModule& module, const std::exception& error) override;

  /// `<dirpath>/<filename>.ckpt`, where it saves.
  std::string ckpt_path() const;

 private:
  std::string dirpath_;
  std::string filename_;
};

}  // namespace lockstep
