// The formats of `lockstep ckpt` (ckpt_formats.h): readers and writers on the library's own
// (checkpoint/checkpoint_io.h, safetensors.h, sharded_checkpoint.h), and the split of a full
// checkpoint into the pieces of a sharded one.
#include "ckpt_formats.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include <torch/torch.h>

#include <lockstep/checkpoint/dcp_checkpoint.h>
#include <lockstep/checkpoint/safetensors.h>
#include <lockstep/core/error.h>

namespace lockstep {
namespace tool {
namespace ckpt {

namespace fs = std::filesystem;
using checkpoint::Checkpoint;
using Dict = c10::impl::GenericDict;

std::string dtype_text(at::ScalarType dtype) {
  switch (dtype) {
    case at::kDouble: return "float64";
    case at::kFloat: return "float32";
    case at::kBFloat16: return "bfloat16";
    case at::kHalf: return "float16";
    case at::kLong: return "int64";
    case at::kInt: return "int32";
    case at::kShort: return "int16";
    case at::kChar: return "int8";
    case at::kByte: return "uint8";
    case at::kBool: return "bool";
    default: return c10::toString(dtype);
  }
}

namespace formats_detail {

bool is_tensor_dict(const c10::IValue& value) {
  if (!value.isGenericDict() || value.toGenericDict().empty()) return false;
  const auto dict = value.toGenericDict();
  return std::all_of(dict.begin(), dict.end(),
                     [](const auto& entry) { return entry.key().isString() && entry.value().isTensor(); });
}

Dict any_dict() { return Dict(c10::AnyType::get(), c10::AnyType::get()); }

// The dict key as a piece key's name: "fc1.weight", "3".
std::string name_of(const c10::IValue& key) {
  return key.isString() ? key.toStringRef() : key.isInt() ? std::to_string(key.toInt()) : "";
}

// A copy of `dict` where each tensor that `cut(name)` takes becomes a piece `prefix + name` in
// `pieces` and None in the copy (to_full_checkpoint puts it back there, in the same order).
Dict cut_tensors(const Dict& dict, const std::string& prefix, const std::function<bool(const std::string&)>& cut,
                 std::map<std::string, at::Tensor>& pieces) {
  Dict kept = any_dict();
  for (const auto& entry : dict) {
    const std::string name = name_of(entry.key());
    if (entry.value().isTensor() && !name.empty() && name.find('/') == std::string::npos && cut(name)) {
      pieces[prefix + name] = entry.value().toTensor();
      kept.insert(entry.key(), c10::IValue());
    } else {
      kept.insert(entry.key(), entry.value());
    }
  }
  return kept;
}

// The Trainer's "optimizer_states" with their per-element tensors (exp_avg, momentum_buffer, ...;
// not Adam's scalar step) cut out, as FSDP's sharded checkpoints hold them.
c10::IValue cut_optimizer_states(const c10::IValue& states, std::map<std::string, at::Tensor>& pieces) {
  if (!states.isList()) return states;
  c10::impl::GenericList kept(c10::AnyType::get());
  const auto list = states.toList();
  for (size_t i = 0; i < list.size(); ++i) {
    const c10::IValue optimizer = list.get(i);
    if (!optimizer.isGenericDict() || !optimizer.toGenericDict().contains("state") ||
        !optimizer.toGenericDict().at("state").isGenericDict()) {
      kept.push_back(optimizer);
      continue;
    }
    Dict copy = any_dict();
    for (const auto& entry : optimizer.toGenericDict()) copy.insert(entry.key(), entry.value());
    Dict state = any_dict();
    for (const auto& parameter : copy.at("state").toGenericDict()) {
      const std::string prefix = "optimizer_states/" + std::to_string(i) + "/state/" + name_of(parameter.key()) + "/";
      state.insert(parameter.key(), parameter.value().isGenericDict() && !name_of(parameter.key()).empty()
                                        ? c10::IValue(cut_tensors(parameter.value().toGenericDict(), prefix,
                                                                  [](const std::string& n) { return n != "step"; }, pieces))
                                        : parameter.value());
    }
    copy.insert_or_assign("state", state);
    kept.push_back(copy);
  }
  return kept;
}

// A checkpoint held whole in memory; cut into pieces for a sharded output.
class FullSource : public Source {
 public:
  explicit FullSource(Checkpoint full) : full_(std::move(full)), common_(checkpoint::make_checkpoint()) {
    const std::string weights = weights_key(full_);
    for (const auto& entry : full_) {
      const std::string& key = entry.key().toStringRef();
      if (key == weights) {
        common_.insert(key, cut_tensors(entry.value().toGenericDict(), key + "/", [](const std::string&) { return true; },
                                        tensors_));
      } else if (key == "optimizer_states") {
        common_.insert(key, cut_optimizer_states(entry.value(), tensors_));
      } else {
        common_.insert(key, entry.value());
      }
    }
  }
  Checkpoint full(bool) const override { return full_; }
  std::map<std::string, TensorLayout> piece_layout() const override {
    std::map<std::string, TensorLayout> layout;
    for (const auto& [key, tensor] : tensors_) layout[key] = {tensor.sizes().vec(), tensor.scalar_type()};
    return layout;
  }
  checkpoint::ShardedCheckpoint pieces(const std::map<std::string, checkpoint::PieceRange>& wanted) const override {
    return {common_, checkpoint::cut_pieces(tensors_, wanted)};
  }

 private:
  Checkpoint full_;
  Checkpoint common_;
  std::map<std::string, at::Tensor> tensors_;
};

// A sharded checkpoint folder (Lockstep's or DCP's), read whole only when a writer needs it whole.
class ShardedSource : public Source {
 public:
  using ReadPieces = std::function<checkpoint::ShardedCheckpoint(const std::string&,
                                                                 const std::map<std::string, checkpoint::PieceRange>&)>;
  using ReadWhole = std::function<checkpoint::ReassembledCheckpoint(const std::string&)>;
  ShardedSource(std::string dir, const std::map<std::string, checkpoint::ShardedTensorInfo>& tensors, ReadPieces pieces,
                ReadWhole whole)
      : dir_(std::move(dir)), read_pieces_(std::move(pieces)), read_whole_(std::move(whole)) {
    for (const auto& [key, info] : tensors) layout_[key] = {info.shape, info.dtype};
  }
  // The weights alone are read piece by piece: the optimizer state is never in memory whole.
  Checkpoint full(bool weights_only) const override {
    std::map<std::string, checkpoint::PieceRange> weights;
    for (const auto& [key, info] : layout_) {
      if (key.rfind("state_dict/", 0) == 0) weights[key] = {0, c10::multiply_integers(info.shape)};
    }
    if (!weights_only || weights.empty()) return checkpoint::to_full_checkpoint(read_whole_(dir_));
    const auto read = read_pieces_(dir_, weights);
    std::map<std::string, at::Tensor> tensors;
    for (const auto& [key, piece] : read.pieces) tensors[key] = piece.values.view(piece.shape);
    return checkpoint::to_full_checkpoint(read.common, tensors);
  }
  std::map<std::string, TensorLayout> piece_layout() const override { return layout_; }
  checkpoint::ShardedCheckpoint pieces(const std::map<std::string, checkpoint::PieceRange>& wanted) const override {
    return read_pieces_(dir_, wanted);
  }

 private:
  std::string dir_;
  std::map<std::string, TensorLayout> layout_;
  ReadPieces read_pieces_;
  ReadWhole read_whole_;
};

// ---- detection ---------------------------------------------------------------------------------

std::string first_bytes(const std::string& path, size_t count) {
  std::ifstream in(path, std::ios::binary);
  std::string bytes(count, '\0');
  in.read(bytes.data(), static_cast<std::streamsize>(count));
  bytes.resize(static_cast<size_t>(std::max<std::streamsize>(in.gcount(), 0)));
  return bytes;
}

bool is_file(const std::string& path) {
  std::error_code ignored;
  return fs::is_regular_file(path, ignored);
}

bool is_dcp_folder(const std::string& path) {
  std::error_code ignored;
  return fs::is_directory(path, ignored) && fs::exists(fs::path(path) / ".metadata", ignored);
}

// A folder that is not DCP's is taken as a Lockstep sharded checkpoint: its reader says what is
// missing (metadata.json after an interrupted save, say).
bool is_sharded_folder(const std::string& path) {
  std::error_code ignored;
  return fs::is_directory(path, ignored) && !is_dcp_folder(path);
}

// By name, or by the first bytes of a file named otherwise: a little-endian header length, then
// the header's JSON object.
bool is_safetensors_file(const std::string& path) {
  if (checkpoint::is_safetensors_path(path)) return true;
  if (!is_file(path)) return false;
  const std::string bytes = first_bytes(path, 9);
  return bytes.size() == 9 && bytes[8] == '{' && bytes[7] == '\0' && bytes[6] == '\0';
}

// torch.save's zip archive, or its legacy pickle (which the reader refuses, saying so).
bool is_torch_file(const std::string& path) {
  if (!is_file(path)) return false;
  const std::string bytes = first_bytes(path, 4);
  return bytes == std::string("PK\x03\x04", 4) || bytes.rfind("\x80\x02", 0) == 0;
}

// ---- readers and writers ----------------------------------------------------------------------

std::unique_ptr<Source> read_torch(const std::string& path) {
  Checkpoint file = checkpoint::CheckpointIO().load(path);
  if (is_tensor_dict(file)) {  // torch.save(model.state_dict()): the weights alone
    Checkpoint wrapped = checkpoint::make_checkpoint();
    wrapped.insert("state_dict", file);
    return std::make_unique<FullSource>(wrapped);
  }
  return std::make_unique<FullSource>(file);
}

std::unique_ptr<Source> read_safetensors(const std::string& path) {
  const auto file = checkpoint::load_safetensors(path);
  Dict weights(c10::StringType::get(), c10::AnyType::get());
  for (const auto& item : file.tensors) weights.insert(item.key(), item.value());
  Checkpoint wrapped = checkpoint::make_checkpoint();
  wrapped.insert("state_dict", weights);
  auto source = std::make_unique<FullSource>(wrapped);
  source->metadata = file.metadata;
  return source;
}

std::unique_ptr<Source> read_sharded(const std::string& path) {
  return std::make_unique<ShardedSource>(path, checkpoint::read_sharded_metadata(path).tensors,
                                         checkpoint::load_sharded_pieces, checkpoint::load_sharded);
}

// A torch.distributed.checkpoint folder, its keys mapped to Lockstep's (checkpoint/dcp_checkpoint.h).
std::unique_ptr<Source> read_dcp(const std::string& path) {
  return std::make_unique<ShardedSource>(
      path, checkpoint::read_dcp_tensors(path),
      [](const std::string& dir, const std::map<std::string, checkpoint::PieceRange>& wanted) {
        return checkpoint::load_dcp_pieces(dir, wanted);
      },
      checkpoint::load_dcp);
}

// A safetensors header's metadata, where a format without a place for it leaves it out; the
// {"format": "pt"} that every writer of PyTorch weights adds says nothing and goes unnamed.
std::vector<std::string> metadata_left_out(const Source& source) {
  std::string keys;
  for (const auto& [key, value] : source.metadata) {
    if (key != "format" || value != "pt") keys += (keys.empty() ? "" : ", ") + key;
  }
  if (keys.empty()) return {};
  return {"the safetensors header's metadata (" + keys + ")"};
}

// `weights_alone`: a checkpoint that holds weights and nothing else is written as the state_dict
// itself, as Python's torch.save(model.state_dict(), path).
std::vector<std::string> write_torch_file(const Source& source, const std::string& out, bool weights_alone) {
  const Checkpoint full = source.full();
  const bool only_weights = full.size() == 1 && full.contains("state_dict") && full.at("state_dict").isGenericDict();
  if (weights_alone && only_weights) {
    checkpoint::CheckpointIO().save(full.at("state_dict"), out);
  } else {
    checkpoint::CheckpointIO().save(full, out);
  }
  return metadata_left_out(source);
}

std::vector<std::string> write_safetensors(const Source& source, const std::string& out) {
  const Checkpoint full = source.full(/*weights_only=*/true);
  const std::string key = weights_key(full);
  if (key.empty()) {
    std::string entries;
    for (const auto& entry : full) entries += (entries.empty() ? "" : ", ") + entry.key().toStringRef();
    throw UsageError("--to safetensors: the input holds no model weights (no \"state_dict\", and no one entry that "
                     "is a dict of tensors alone; its entries are " + (entries.empty() ? "none" : entries) +
                     "). Convert a checkpoint that holds a state_dict, or --to torch to keep the dict as it is.");
  }
  c10::Dict<std::string, at::Tensor> tensors;
  std::vector<std::string> left_out;
  for (const auto& entry : full.at(key).toGenericDict()) {
    if (entry.value().isTensor()) {
      tensors.insert(entry.key().toStringRef(), entry.value().toTensor());
    } else {
      left_out.push_back("\"" + key + "/" + name_of(entry.key()) + "\" (not a tensor)");
    }
  }
  for (const auto& entry : full) {
    if (entry.key().toStringRef() != key) left_out.push_back(entry.key().toStringRef());
  }
  std::map<std::string, std::string> metadata = source.metadata;
  if (metadata.empty()) metadata = {{"format", "pt"}};  // as transformers' save_pretrained writes
  checkpoint::save_safetensors(tensors, out, metadata);
  return left_out;
}

// Rank `rank`'s share of each tensor: an even split of its flattened elements, as FSDP's flat
// shards (a load reshards any split).
std::map<std::string, checkpoint::PieceRange> even_ranges(const std::map<std::string, TensorLayout>& layout,
                                                          int rank, int world_size) {
  std::map<std::string, checkpoint::PieceRange> ranges;
  for (const auto& [key, info] : layout) {
    int64_t numel = 1;
    for (const int64_t size : info.shape) numel *= size;
    const int64_t chunk = (numel + world_size - 1) / world_size;
    const int64_t begin = std::min(numel, chunk * rank);
    ranges[key] = {begin, std::min(chunk, numel - begin)};
  }
  return ranges;
}

std::vector<std::string> write_sharded(const Source& source, const std::string& out, const ConvertOptions& options) {
  const int world_size = options.world_size;
  if (world_size < 1) {
    throw UsageError("--to lockstep-sharded needs --world-size N (the number of ranks, one file each); got " +
                     std::to_string(world_size) + ". Pass the world size of the run that will resume from it.");
  }
  const auto layout = source.piece_layout();
  const std::string tmp = checkpoint::begin_sharded_save(out, 0);
  try {
    for (int rank = 0; rank < world_size; ++rank) {
      checkpoint::write_shard(tmp, rank, world_size, source.pieces(even_ranges(layout, rank, world_size)));
      options.progress("wrote rank " + std::to_string(rank + 1) + " of " + std::to_string(world_size));
    }
    checkpoint::commit_sharded_save(tmp, out, world_size);
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);  // what a finished save would have renamed: OUT itself is untouched
    throw;
  }
  return metadata_left_out(source);
}

}  // namespace formats_detail

std::string weights_key(const Checkpoint& full) {
  if (full.contains("state_dict") && full.at("state_dict").isGenericDict()) return "state_dict";
  std::string found;
  for (const auto& entry : full) {
    if (!formats_detail::is_tensor_dict(entry.value())) continue;
    if (!found.empty()) return "";
    found = entry.key().toStringRef();
  }
  return found;
}

const std::vector<Format>& formats() {
  using namespace formats_detail;
  static const std::vector<Format> all = {
      {"lockstep-sharded", "Lockstep sharded checkpoint folder", is_sharded_folder, read_sharded,
       write_sharded, true},
      // Written by a run (--fsdp-state-dict-type dcp), which knows each parameter's name.
      {"dcp", "torch.distributed.checkpoint folder", is_dcp_folder, read_dcp, nullptr, true,
       "DCP names optimizer state by each parameter's name, which the checkpoints lockstep ckpt reads do not hold. "
       "Save DCP folders from the run itself (--strategy fsdp --fsdp-state-dict-type dcp), or convert to "
       "lockstep-sharded."},
      {"safetensors", "safetensors file", is_safetensors_file, read_safetensors,
       [](const Source& s, const std::string& out, const ConvertOptions&) { return write_safetensors(s, out); }},
      {"torch", "torch.save file", is_torch_file, read_torch,
       [](const Source& s, const std::string& out, const ConvertOptions&) { return write_torch_file(s, out, true); }},
      // Read as "torch" (the same zip file); inspect names it by what the dict holds.
      {"lockstep", "Lockstep full checkpoint file", nullptr, read_torch,
       [](const Source& s, const std::string& out, const ConvertOptions&) { return write_torch_file(s, out, false); }},
  };
  return all;
}

const Format& detect_format(const std::string& path) {
  std::error_code ignored;
  if (!fs::exists(path, ignored)) {
    throw UsageError("'" + path + "' does not exist. Pass a checkpoint file or a sharded checkpoint's folder.");
  }
  for (const auto& format : formats()) {
    if (format.detect && format.detect(path)) return format;
  }
  throw UsageError("'" + path + "' is in no checkpoint format that lockstep ckpt knows: it is not a torch.save zip "
                   "file, not safetensors (a .safetensors file, or a .safetensors.index.json index) and not a "
                   "folder. Pass one of those (lockstep ckpt --help lists the formats).");
}

const Format& format_named(const std::string& name) {
  std::string names;
  for (const auto& format : formats()) {
    if (format.name == name) return format;
    names += (names.empty() ? "" : ", ") + format.name;
  }
  throw UsageError("--to " + name + " is not a format; pass one of " + names + ".");
}

}  // namespace ckpt
}  // namespace tool
}  // namespace lockstep
