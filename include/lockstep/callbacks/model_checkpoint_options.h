#pragma once
/// Options of ModelCheckpoint (Lightning's ModelCheckpoint arguments).

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include <torch/arg.h>

namespace lockstep {

///   ModelCheckpoint(ModelCheckpointOptions().monitor("val_loss").save_top_k(3).save_last(true)
///                       .filename("{epoch}-{val_loss:.2f}"))   // epoch=4-val_loss=0.12.ckpt
struct ModelCheckpointOptions {
  /// Directory of the checkpoint files. Default: "" (`<trainer.log_dir()>/checkpoints`).
  TORCH_ARG(std::string, dirpath) = "";
  /// File name pattern without ".ckpt": `{name}` or `{name:fmt}` (Python format specs such as
  /// `.2f`, `03d`, `.3e`) take `epoch`, `step` or any logged metric (0 when not logged).
  /// Default: "" (`{epoch}-{step}`, which gives "epoch=3-step=120.ckpt").
  TORCH_ARG(std::string, filename) = "";
  /// Write `{val_loss}` as "val_loss=0.1234" rather than "0.1234". Default: true.
  TORCH_ARG(bool, auto_insert_metric_name) = true;
  /// Logged metric that ranks checkpoints; "" keeps the latest ones. Default: "".
  TORCH_ARG(std::string, monitor) = "";
  /// "min" (lower is better) or "max". Default: "min".
  TORCH_ARG(std::string, mode) = "min";
  /// Keep the best k checkpoints; -1 keeps all, 0 writes none (but last.ckpt). Default: 1.
  TORCH_ARG(int64_t, save_top_k) = 1;
  /// Also write `last.ckpt` at every save point, replacing the previous one. Default: false.
  TORCH_ARG(bool, save_last) = false;
  /// Save after every n-th training epoch (after its validation); 0 never. Default: unset (1, or
  /// 0 when every_n_train_steps or train_time_interval is set, as Lightning).
  TORCH_ARG(std::optional<int64_t>, every_n_epochs) = std::nullopt;
  /// Save after every n-th optimizer step; 0 never. Default: 0.
  TORCH_ARG(int64_t, every_n_train_steps) = 0;
  /// Save at the end of the first optimizer step at which this many seconds of wall time have
  /// passed since fit started (a resumed fit too) or since the last save it caused, by rank 0's
  /// clock, which every rank follows (Lightning's train_time_interval); 0 never. Default: 0.
  TORCH_ARG(double, train_time_interval) = 0.0;

 public:
  /// The same as a duration: `.train_time_interval(std::chrono::minutes(30))`.
  template <typename Rep, typename Period>
  ModelCheckpointOptions& train_time_interval(std::chrono::duration<Rep, Period> interval) {
    return train_time_interval(std::chrono::duration<double>(interval).count());
  }
  /// Also write the module's weights beside each checkpoint as safetensors, removed with it:
  /// `<name>.safetensors`, or with several ranks `<name>.safetensors.index.json` and one shard
  /// per rank that each rank writes (under FSDP no rank gathers the whole model), as
  /// transformers' `save_safetensors`. Default: false.
  TORCH_ARG(bool, save_safetensors) = false;
  /// Print on rank 0 whether each candidate entered the top k. Default: false.
  TORCH_ARG(bool, verbose) = false;
};

}  // namespace lockstep
