#pragma once
// The checkpoint formats of `lockstep ckpt`: each is one entry of formats() with a reader and a
// writer (either may be missing: the format is then refused by name), so that a format is added
// in one place. What a conversion carries between them is a Source.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <lockstep/checkpoint/checkpoint_io.h>
#include <lockstep/checkpoint/sharded_checkpoint.h>

namespace lockstep {
namespace tool {
namespace ckpt {

/// A full tensor's shape and dtype, by the piece key a sharded checkpoint gives it.
struct TensorLayout {
  std::vector<int64_t> shape;
  at::ScalarType dtype = at::kFloat;
};

/// A checkpoint read by a format's reader. Weights alone (a state_dict, a safetensors file) come
/// as {"state_dict": weights}, so every writer sees one layout.
class Source {
 public:
  virtual ~Source() = default;
  /// The whole checkpoint as one dict. With `weights_only`, a source that can read less may leave
  /// out the tensors of everything but the model's weights (their entries stay, so that a writer
  /// can name what it leaves out).
  virtual checkpoint::Checkpoint full(bool weights_only = false) const = 0;
  /// The tensors a sharded checkpoint cuts into pieces (the model's weights and the optimizers'
  /// per-element state), by piece key ("state_dict/fc1.weight").
  virtual std::map<std::string, TensorLayout> piece_layout() const = 0;
  /// One rank's part of a sharded checkpoint: the `wanted` pieces and the common dict.
  virtual checkpoint::ShardedCheckpoint pieces(const std::map<std::string, checkpoint::PieceRange>& wanted) const = 0;

  std::map<std::string, std::string> metadata;  ///< a safetensors header's "__metadata__"
};

/// What a conversion is asked for beyond IN and OUT.
struct ConvertOptions {
  int world_size = 0;  ///< ranks of a sharded output (0: not given)
  /// Prints one progress line (to stderr), or nothing when progress is off.
  std::function<void(const std::string&)> progress = [](const std::string&) {};
};

/// One format: its `--to` name, the words inspect prints for it, and what reads and writes it.
struct Format {
  std::string name;
  std::string description;
  /// Whether `path` is in this format, by its name or first bytes (no reader: the format is known
  /// but not read by this build).
  std::function<bool(const std::string& path)> detect;
  std::function<std::unique_ptr<Source>(const std::string& path)> read;
  /// Writes `source` to `out` atomically; returns what the format cannot hold and was left out.
  std::function<std::vector<std::string>(const Source& source, const std::string& out, const ConvertOptions& options)>
      write;
  bool writes_folder = false;  ///< OUT is a folder (a sharded checkpoint), not a file
  /// Why a format without a writer is not written, and the fix ("": not available in this build).
  std::string no_writer = "";
};

/// Every format, in the order detection tries them.
const std::vector<Format>& formats();

/// The format `path` is in; UsageError naming the path, what was found and the formats read.
const Format& detect_format(const std::string& path);

/// The format named `name` (a `--to` value); UsageError listing the names for another.
const Format& format_named(const std::string& name);

/// The key of `full` that holds the model's weights: "state_dict", else the one entry that is a
/// dict of tensors alone (Fabric's {"model": ...}); "" when there is none or several.
std::string weights_key(const checkpoint::Checkpoint& full);

/// "float32", "bfloat16": Python's name of a dtype.
std::string dtype_text(at::ScalarType dtype);

}  // namespace ckpt
}  // namespace tool
}  // namespace lockstep
