#pragma once
/// CheckpointIO: writes a checkpoint dict atomically in the zip format of Python's `torch.save`,
/// and reads it back, with one clear error for a file that is missing, damaged or not a checkpoint.

#include <string>
#include <vector>

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>

namespace lockstep {
namespace checkpoint {

/// A checkpoint: string keys ("state_dict", "optimizer_states", "epoch", "global_step", ...) to
/// any value an IValue holds (tensors, ints, doubles, strings, bools, None, lists, tuples, dicts).
using Checkpoint = c10::impl::GenericDict;

/// An empty checkpoint (a `Dict[str, Any]`), ready for `insert`.
///   auto ckpt = make_checkpoint();
///   ckpt.insert("state_dict", state_dict(*model));
///   ckpt.insert("epoch", int64_t{3});
Checkpoint make_checkpoint();

/// Saves and loads checkpoint files (the analog of Lightning's `TorchCheckpointIO`). Override it
/// to store checkpoints elsewhere; the Trainer calls only these three methods.
///
/// Format: the zip archive of `torch::pickle_save` (`archive/data.pkl` in pickle protocol 2, one
/// stored record `archive/data/<N>` per tensor storage, `archive/version`), built from the same
/// LibTorch parts but without TorchScript type tags, so the pickle holds only dicts, lists,
/// tuples, scalars and `torch._utils._rebuild_tensor_v2` tensors. Python's `torch.load(path)`
/// reads it as a plain dict, also with `weights_only=True` (the default from PyTorch 2.6; in
/// 1.13 that mode still rejects any Python float). Loaded lists and dicts are generic (element
/// type Any): read them with `toListRef()` and `toGenericDict()`, not `toIntVector()`.
///
///   CheckpointIO io;
///   io.save(ckpt, "runs/version_0/checkpoints/last.ckpt");
///   Checkpoint back = io.load("runs/version_0/checkpoints/last.ckpt");
///   int64_t epoch = back.at("epoch").toInt();
class CheckpointIO {
 public:
  virtual ~CheckpointIO() = default;

  /// Writes `checkpoint` (a dict with string keys) to `path`, creating missing parent
  /// directories. Atomic: the bytes go to a new `<path>.tmp.XXXXXX` (created exclusively, so never
  /// a name or symlink planted in a shared directory), which is fsync'ed, renamed over `path`, and
  /// the directory fsync'ed; on any failure the previous file at `path` is left as it was, the
  /// temporary file is removed, and an IoError names the path, the step that failed and the OS's reason.
  /// A path ending in ".safetensors" (or ".safetensors.index.json", Hugging Face's sharded form)
  /// is written as safetensors (checkpoint/safetensors.h) with the metadata {"format": "pt"} that
  /// transformers' `save_pretrained` writes: `checkpoint` must then hold only tensors by name (a
  /// state_dict); any other entry is a UsageError naming it.
  virtual void save(const c10::IValue& checkpoint, const std::string& path) const;

  /// Reads a checkpoint written by save(), or any dict that Python's torch.save wrote (torch 1.13
  /// and 2.x, default protocol): `torch.save(model.state_dict(), path)` (an OrderedDict; its
  /// `_metadata` is dropped), plain and nested dicts, lists and tuples of tensors, numbers and
  /// strings. Tensors load onto the CPU, as torch.load(map_location="cpu"). The zip records'
  /// CRC32s are verified (LibTorch's reader does not), so a damaged file is an error, not
  /// silently wrong weights. Throws UsageError naming `path`, what is wrong with it and what to
  /// do, for a missing or unreadable file, a truncated or corrupt one, one that is not a dict,
  /// and a pickled Python object (torch.save(model) of a whole nn.Module, an nn.Parameter, any
  /// other class: save model.state_dict() instead). A path ending in ".safetensors" or
  /// ".safetensors.index.json" is read as safetensors (load_safetensors in
  /// checkpoint/safetensors.h): the dict of its tensors by name, sorted by name.
  virtual Checkpoint load(const std::string& path) const;

  /// Deletes the checkpoint at `path` (a file, or a sharded checkpoint's directory with all it
  /// holds); a missing one is not an error, one that stays is an IoError.
  virtual void remove(const std::string& path) const;
};

/// Throws UsageError naming `path` and every key of `keys` that `checkpoint` lacks.
void require_keys(const Checkpoint& checkpoint, const std::vector<std::string>& keys, const std::string& path);

}  // namespace checkpoint
}  // namespace lockstep
