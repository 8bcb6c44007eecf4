#pragma once
/// Options of PyTorchProfiler (Lightning's PyTorchProfiler arguments and its default schedule).

#include <cstdint>
#include <string>

#include <torch/arg.h>

namespace lockstep {

///   PyTorchProfiler(PyTorchProfilerOptions().wait(10).active(5).dirpath("traces"))
struct PyTorchProfilerOptions {
  /// The folder of the traces, one per rank: <dirpath>/<stage>-rank_<R>.pt.trace.json. "" means
  /// <log_dir>/profiler, under the run's log directory (Lightning's dirpath=None). Default: "".
  TORCH_ARG(std::string, dirpath) = "";
  /// Training batches that run untraced first: the first ones pay one-time costs (allocations,
  /// the first bucket build of DDP). Lightning's default schedule waits 1 and warms up 1. Default: 2.
  TORCH_ARG(int64_t, wait) = 2;
  /// Training batches traced after those, each with its hooks, validation and checkpoint, so
  /// that a long run writes a short trace (Lightning's active=3). Default: 3.
  TORCH_ARG(int64_t, active) = 3;
  /// Rows of summary()'s table of the traced actions and operations, by self time (Lightning's
  /// row_limit). Default: 20.
  TORCH_ARG(int64_t, row_limit) = 20;
};

}  // namespace lockstep
