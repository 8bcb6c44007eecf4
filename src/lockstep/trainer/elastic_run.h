#pragma once
// A job its launcher restarts (torchrun's agent, lockstep launch or self-launch with
// --max-restarts; TORCHELASTIC_RUN_ID set) stays one run: with --ckpt-path last every attempt
// continues in the run folder of the checkpoint it resumes, and rank 0 says what a restart cost.
// Not installed.

#include <cstdint>
#include <optional>
#include <string>

namespace lockstep {
namespace detail {

/// Whether this process is a worker of a launcher that may start it again (TORCHELASTIC_RUN_ID).
bool under_restarting_launcher();

/// The version number of the run whose newest last.ckpt lies under `experiment_dir`
/// (`<root>/lockstep_logs`), or nullopt when none saved one.
std::optional<int64_t> version_with_last_checkpoint(const std::string& experiment_dir);

/// This job's TORCHELASTIC_RUN_ID ("" without one).
std::string run_id();

/// Whether the run in `log_dir` was made by this job (its progress.txt names this run id): the
/// attempts of one job continue one folder; a new job resuming from it starts its own.
bool made_by_this_job(const std::string& log_dir);

/// Where the previous attempt of the run in `log_dir` got to, from its progress.txt.
struct AttemptProgress {
  int world_size = 0;
  int64_t global_step = 0;
};
std::optional<AttemptProgress> read_attempt_progress(const std::string& log_dir);

/// Rank 0's record of this attempt in `log_dir`/progress.txt: its world size and the last step
/// it trained, rewritten in place after each step (one small pwrite, no fsync: a step costs no
/// more than that; a lost host may lose the last step or so of the record), then the job's run id.
class AttemptRecord {
 public:
  AttemptRecord(const std::string& log_dir, int world_size, int64_t global_step);
  ~AttemptRecord();
  AttemptRecord(const AttemptRecord&) = delete;
  AttemptRecord& operator=(const AttemptRecord&) = delete;
  void at_step(int64_t global_step);

 private:
  int fd_ = -1;
  int world_size_;
  int64_t written_ = -1;
};

/// The line rank 0 prints when an attempt resumes after another: the world sizes, the checkpoint
/// (empty: none yet, training from the start) and its step, and the steps trained after it.
std::string membership_line(const AttemptProgress& before, int world_size, const std::string& checkpoint,
                            int64_t checkpoint_step);

/// A mid-epoch checkpoint's next batch at another world size. The ranks' batches of an epoch take
/// the sampler's order in turn, so `next_batch` batches at `saved_world` ranks are its first
/// next_batch * saved_world batches' worth of examples; at `world_size` ranks the epoch goes on
/// from the last batch that starts within them (repeating the rest of them, fewer than one batch
/// per rank). A checkpoint after the epoch's last batch (`saved_batches` of them) stays at the
/// end: `batches`, this size's count.
int64_t next_batch_at(int64_t next_batch, int saved_world, int64_t saved_batches, int world_size, int64_t batches);

}  // namespace detail
}  // namespace lockstep
