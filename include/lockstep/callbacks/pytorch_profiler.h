#pragma once
/// PyTorchProfiler: a Chrome trace per rank from LibTorch's own profiler, as Lightning's
/// PyTorchProfiler (`--profiler pytorch`).

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>

#include <lockstep/callbacks/profiler.h>
#include <lockstep/callbacks/pytorch_profiler_options.h>

namespace lockstep {

/// Traces a few training batches on every rank with LibTorch's profiler: the Trainer's actions
/// ("training_step", "backward", "optimizer_step", "[Callback]<name>.<hook>", ...; SimpleProfiler
/// lists them) as record_function ranges, and the operations they run (aten::addmm, ...) inside
/// them. Each rank writes <dirpath>/fit-rank_<R>.pt.trace.json: Chrome's trace format, which
/// https://ui.perfetto.dev and chrome://tracing open, with the rank as its process id. The trace
/// holds batches wait+1 to wait+active of fit (3 to 5 by default), counted over all epochs;
/// summary() names the files and tables the traced time by action and operation.
///
///   trainer.set_profiler(std::make_shared<PyTorchProfiler>(PyTorchProfilerOptions().wait(0).active(2)));
///
/// Only fit's thread is traced, and the threads LibTorch runs its work on for it (autograd's,
/// c10d's). The legacy profiler of LibTorch traces the CPU: the Debian build of LibTorch 1.13 has no
/// Kineto, and with it no CUDA activity; a CUDA kernel shows as the CPU time of its launch.
class PyTorchProfiler : public Profiler {
 public:
  /// A bad option (wait below 0, active below 1, row_limit below 0) is a UsageError.
  explicit PyTorchProfiler(PyTorchProfilerOptions options = {});
  ~PyTorchProfiler() override;
  PyTorchProfiler(const PyTorchProfiler&) = delete;
  PyTorchProfiler& operator=(const PyTorchProfiler&) = delete;

  /// The ranges are the trace: nothing to add.
  void record(const std::string& action, double seconds) override;
  std::string summary() const override;
  std::unique_ptr<Range> start(const std::string& action) override;
  void setup(const std::string& stage, int global_rank, const std::string& log_dir) override;
  void teardown(const std::string& stage) override;

  /// The trace this rank wrote since the last setup(), or "" when it wrote none.
  const std::string& trace_path() const { return trace_path_; }

 private:
  void begin_trace();
  void end_trace();

  PyTorchProfilerOptions options_;
  std::string stage_ = "fit";
  int rank_ = 0;
  std::string dir_;
  int64_t batches_ = 0;  // training batches begun since setup
  int64_t traced_batches_ = 0;
  // LibTorch's profiler is on for the thread that started it (fit's) only: scopes opened on other
  // threads read these two, and are not traced.
  std::atomic<bool> tracing_{false};
  std::thread::id tracing_thread_;
  std::string trace_path_;
  std::string table_;
};

}  // namespace lockstep
