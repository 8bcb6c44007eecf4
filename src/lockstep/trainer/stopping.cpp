// The Trainer's agreed stops (distributed::AgreedStop): a loss that is not finite, and a signal
// (Ctrl-C's SIGINT, SIGTERM, SLURM's SIGUSR1) after which every rank saves last.ckpt and ends at
// the same step.
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <iostream>

#include <torch/torch.h>

#include <lockstep/callbacks/model_checkpoint.h>
#include <lockstep/launchers/launcher.h>
#include <lockstep/loggers/logger.h>
#include <lockstep/trainer/trainer.h>
#include <lockstep/trainer/training_stopped.h>

namespace lockstep {
namespace {

// Under SLURM, SIGUSR1 is the warning before the time limit (sbatch --signal=USR1@90): the job
// asks to be queued again, as Lightning's SLURMEnvironment(auto_requeue=True) does. Returns what
// happened, for the message.
std::string requeue_under_slurm(int signal) {
  const char* job = std::getenv("SLURM_JOB_ID");
  if (signal != SIGUSR1 || job == nullptr || *job == '\0') return "";
  const std::string id = job;
  for (unsigned char c : id) {
    if (!std::isalnum(c) && c != '_') return " SLURM_JOB_ID '" + id + "' is not a job id; not requeued.";
  }
  const int status = std::system(("scontrol requeue " + id).c_str());
  if (status == 0) return " Requeued SLURM job " + id + " (scontrol requeue); it resumes when it starts again.";
  return " `scontrol requeue " + id + "` failed (status " + std::to_string(status) + "); requeue it yourself.";
}

}  // namespace

void Trainer::check_loss(const torch::Tensor& loss, int64_t batch_idx) {
  if (!loss.defined() || agreed_stop_ == nullptr) return;
  const auto value = loss.detach();
  if (value.isfinite().all().item<bool>()) return;
  const std::string what = value.isnan().any().item<bool>() ? "nan" : "inf";
  agreed_stop_->request("rank " + std::to_string(plan_.strategy->global_rank()) + " got a " + what + " loss in step " +
                        std::to_string(global_step_ + 1) + " (epoch " + std::to_string(current_epoch_) + ", batch " +
                        std::to_string(batch_idx) + ")");
}

void Trainer::end_stopped_fit(const distributed::StopRequest& request) {
  const std::string where = "after step " + std::to_string(global_step_) + " (epoch " + std::to_string(current_epoch_) +
                            ", batch " + std::to_string(batches_done_) + " of " + std::to_string(num_training_batches_) + ")";
  if (request.signal == 0) {
    for (auto& logger : loggers_) logger->finalize("failed");
    throw NonFiniteLoss(request.reason + "; every rank stopped " + where + ", without saving. Lower the learning "
                        "rate, clip gradients (--gradient-clip-val), check the data, or find the operation that made "
                        "it with --detect-anomaly true.");
  }
  // Every rank ends with this code: under self-launch the workers' exits are then not failures
  // that would end this rank before it reports the stop.
  launchers::expect_launched_job_exit(128 + request.signal);
  for (auto& logger : loggers_) logger->finalize("interrupted");
  const bool is_zero = plan_.strategy->is_global_zero();
  // Ctrl-C saves only where checkpointing is on; a scheduler's signal always does, so that the
  // job it stops (or requeues) can continue.
  const bool checkpointing = options_.enable_checkpointing() ||
                             std::any_of(callbacks_.begin(), callbacks_.end(), [](const auto& c) {
                               return dynamic_cast<const ModelCheckpoint*>(c.get()) != nullptr;
                             });
  if (request.signal == SIGINT && !checkpointing) {
    throw StoppedBySignal(request.reason + ": every rank stopped " + where +
                              "; nothing saved (--enable-checkpointing false).",
                          request.signal, is_zero);
  }
  std::string requeued;
  const auto requeue = [&] {
    requeued = is_zero ? requeue_under_slurm(request.signal) : "";
    if (!requeued.empty()) std::cerr << "lockstep:" + requeued + "\n";
  };
  // Under srun the checkpoint comes first, as in Lightning: a requeue makes SLURM SIGTERM the tasks
  // within milliseconds (10-20 ms on the live test's cluster), and that second signal ends a process
  // at once. Under self-launch the requeue comes first, chosen when the workers' exit after the
  // checkpoint's barrier ended this process at once (expect_launched_job_exit above now prevents
  // that); no live test runs SLURM with self-launch.
  if (plan_.self_launched) requeue();
  const std::string path = (std::filesystem::path(log_dir_) / "checkpoints" / "last.ckpt").string();
  save_checkpoint(path);  // every rank takes part; rank 0 writes, atomically
  if (!plan_.self_launched) requeue();
  throw StoppedBySignal(request.reason + ": every rank stopped " + where + " and saved " + path +
                            ". Continue with --ckpt-path last." + requeued,
                        request.signal, is_zero);
}

}  // namespace lockstep
