#pragma once
/// safetensors: Hugging Face's file of named tensors (`model.safetensors`), and its sharded form
/// (`model.safetensors.index.json` beside `model-00001-of-00002.safetensors`, ...), read and
/// written as Python's `safetensors` package and `transformers` do. CheckpointIO reads and writes
/// them by the path's ending, so `fabric.load_raw`, `fabric.save` and the Trainer's
/// `--init-weights` take them too.

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <ATen/core/Dict.h>
#include <ATen/core/Tensor.h>

namespace lockstep {
namespace checkpoint {

/// What a safetensors file, or a sharded one's index with its shards, holds. The dtypes read and
/// written: F64, F32, BF16, F16, I64, I32, I16, I8, U8 and BOOL.
struct Safetensors {
  c10::Dict<std::string, at::Tensor> tensors;   ///< by name, sorted by name
  std::map<std::string, std::string> metadata;  ///< the header's "__metadata__"; a sharded one's: the index's "metadata" (a value that is not a string as JSON text)
};

/// The largest shard save_sharded_safetensors writes unless told: 5 GB, the `max_shard_size`
/// default of transformers' `save_pretrained`.
constexpr int64_t kDefaultMaxShardBytes = 5'000'000'000;

/// Whether `path` names safetensors by its ending: ".safetensors" (one file) or
/// ".safetensors.index.json" (a sharded one's index).
bool is_safetensors_path(const std::string& path);
/// Whether `path` ends in ".safetensors.index.json": a sharded one's index.
bool is_safetensors_index_path(const std::string& path);

/// Reads one `.safetensors` file, or, for a path ending in ".safetensors.index.json", the index
/// and every shard it names (in the index's folder). Tensors are on the CPU and alias the file's
/// memory map (copy on write: changing one never changes the file) wherever the layout allows,
/// as in every file Python or Lockstep writes (each tensor's bytes aligned to its element size);
/// else they are copies. Python's checks, and a few more, come first: a file that is truncated,
/// whose header length is over 100 MB or past its end, whose header is not the JSON it should
/// be, names an unknown dtype, or whose data_offsets leave a gap, overlap, reach past the data or
/// disagree with dtype and shape, a BOOL byte that is not 0 or 1, an index that names a shard
/// outside its folder or a tensor its shard lacks: each is one UsageError naming the file and
/// the problem, and no byte outside the file is ever read.
///   auto weights = checkpoint::load_safetensors("model.safetensors");
///   checkpoint::load_state_dict(*net, c10::impl::toGenericDict(weights.tensors));
Safetensors load_safetensors(const std::string& path);

/// Writes `tensors` to `path` as Python's `safetensors.torch.save_file(tensors, path, metadata)`
/// does, byte for byte: the tensors ordered by dtype (8-byte ones first, so each is aligned) and
/// then by name, the header padded with spaces to a multiple of 8 bytes. Tensors on a device are
/// copied to the CPU one at a time. Atomic: written to `<path>.tmp.XXXXXX` and renamed, so a
/// failure leaves the previous file as it was. A dtype outside the list above, a tensor that is
/// not dense, or the name "__metadata__" is a UsageError naming the tensor. A path ending in
/// ".safetensors.index.json" is written as save_sharded_safetensors(tensors, path).
///   checkpoint::save_safetensors(checkpoint::state_dict(*net), "model.safetensors", {{"format", "pt"}});
void save_safetensors(const c10::Dict<std::string, at::Tensor>& tensors, const std::string& path,
                      const std::map<std::string, std::string>& metadata = {});

/// Writes `tensors` in Hugging Face's sharded form: for "out/model.safetensors.index.json", the
/// shards "out/model-00001-of-0000N.safetensors", ... (names in sorted order, a new shard when
/// the next tensor would take one past `max_shard_bytes`; a bigger tensor gets a shard of its
/// own), each with `metadata` in its header, then the index {"metadata": {"total_size": bytes},
/// "weight_map": {name: shard}}, as transformers' `save_pretrained` writes it. Each file is
/// written atomically, the index last. A path not ending in ".safetensors.index.json", or
/// max_shard_bytes under 1, is a UsageError.
void save_sharded_safetensors(const c10::Dict<std::string, at::Tensor>& tensors, const std::string& index_path,
                              int64_t max_shard_bytes = kDefaultMaxShardBytes,
                              const std::map<std::string, std::string>& metadata = {});

/// The path of shard `number` (from 1) of `count` beside the index `index_path`, as transformers
/// names them: ("out/model.safetensors.index.json", 2, 4) gives "out/model-00002-of-00004.safetensors".
/// A path not ending in ".safetensors.index.json" is a UsageError.
std::string safetensors_shard_path(const std::string& index_path, std::size_t number, std::size_t count);

/// Writes the index at `index_path` for shards already written beside it (`shard_paths`, in
/// order): each shard's header gives its tensors' names and sizes. For sharded saves where each
/// process writes its own shard. Atomic; a shard that is missing or damaged, or a name in two
/// shards, is a UsageError naming it.
void write_safetensors_index(const std::string& index_path, const std::vector<std::string>& shard_paths);

}  // namespace checkpoint
}  // namespace lockstep
