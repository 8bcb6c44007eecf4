#pragma once
/// The errors fit() ends with when every rank stopped together (see distributed::AgreedStop).

#include <string>

#include <lockstep/core/error.h>

namespace lockstep {

/// A signal (Ctrl-C's SIGINT, SIGTERM, SLURM's SIGUSR1) asked the job to stop: every rank stopped
/// after the same step, once last.ckpt was saved (for SIGINT, when checkpointing is on);
/// `--ckpt-path last` continues from it. Exit code 128 + signal, as if the signal had ended the
/// process. Every rank throws it with the same message; only global rank 0's is reported
/// (Error::report_here).
class StoppedBySignal : public Error {
 public:
  StoppedBySignal(const std::string& message, int signal, bool report_here = true)
      : Error(ErrorKind::stopped, message, 128 + signal) {
    set_report_here(report_here);
  }
};

/// A loss that is not finite (NaN or inf) on some rank: every rank stopped after the same step,
/// without saving. Exit code 1.
class NonFiniteLoss : public Error {
 public:
  explicit NonFiniteLoss(const std::string& message) : Error(ErrorKind::training, message) {}
};

}  // namespace lockstep
