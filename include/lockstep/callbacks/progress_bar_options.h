#pragma once
/// Options of ProgressBar.

#include <cstdint>
#include <optional>

#include <torch/arg.h>

namespace lockstep {

///   ProgressBar(ProgressBarOptions().print_every_n_batches(100))   // in a batch job's log
struct ProgressBarOptions {
  /// A live bar redrawn in place with '\r' (true) or plain lines (false). Default: unset (live
  /// when stderr is a terminal).
  TORCH_ARG(std::optional<bool>, live) = std::nullopt;
  /// Plain lines: one each time an epoch's progress crosses a multiple of this percentage.
  /// Default: 10.
  TORCH_ARG(double, print_every_percent) = 10.0;
  /// Plain lines: one every n batches instead; 0 uses print_every_percent. Default: 0.
  TORCH_ARG(int64_t, print_every_n_batches) = 0;
  /// Live bar: redraw at most this often, in seconds; the last batch is always drawn. Default: 0.1.
  TORCH_ARG(double, refresh_seconds) = 0.1;
  /// Live bar: width of the bar itself, in characters. Default: 20.
  TORCH_ARG(int64_t, bar_width) = 20;
};

}  // namespace lockstep
