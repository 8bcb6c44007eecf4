// Reading a DCP checkpoint (dcp_checkpoint.h): its `.metadata`, the key table, and the chunks
// that the wanted pieces overlap.

#include <lockstep/checkpoint/dcp_checkpoint.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>

#include <torch/torch.h>

#include <lockstep/core/error.h>

#include "dcp_metadata.h"
#include "sharded_format.h"
#include "torch_file.h"
#include "zip_check.h"

namespace lockstep {
namespace checkpoint {
namespace {

namespace fs = std::filesystem;
using detail::DcpChunk;
using detail::DcpItem;
using detail::DcpStorage;

const char* const kDcpFix =
    "Pass a folder that torch.distributed.checkpoint's dcp.save (FileSystemWriter) or Lockstep wrote, complete";

// An opened DCP folder: its metadata, where each chunk and bytes item is stored, and the key table.
struct DcpFolder {
  fs::path dir;
  detail::DcpMetadata metadata;
  std::map<std::pair<std::string, std::vector<int64_t>>, DcpStorage> chunks;  // by (fqn, offsets)
  std::map<std::string, DcpStorage> bytes;                                     // by fqn
  std::map<std::string, std::string> piece_of;  // DCP fqn -> Lockstep piece key
  std::map<std::string, std::string> fqn_of;    // Lockstep piece key -> DCP fqn
  std::map<std::string, int64_t> parameter_index;  // optimizer parameter fqn -> k
  // Every record is read into this one buffer: a fresh one per record would fault in new pages
  // each time (large allocations are mapped and unmapped, core/heap.h).
  mutable std::vector<char> buffer;
};

[[noreturn]] void refuse(const fs::path& dir, const std::string& what) {
  throw UsageError("DCP checkpoint '" + dir.string() + "': " + what + ". " + kDcpFix + ".");
}

// Reads [offset, offset + length) of `path` into `bytes`.
void read_bytes(const fs::path& path, int64_t offset, int64_t length, const fs::path& dir, std::vector<char>& bytes) {
  std::error_code error;
  const auto size = fs::file_size(path, error);
  if (error) refuse(dir, "'" + path.filename().string() + "' cannot be read (" + error.message() + ")");
  if (offset < 0 || length < 0 || static_cast<uint64_t>(offset) > size || static_cast<uint64_t>(length) > size - offset) {
    refuse(dir, "a record [" + std::to_string(offset) + ", +" + std::to_string(length) + ") lies past the end of '" +
                    path.filename().string() + "' (" + std::to_string(size) + " bytes): the file is truncated");
  }
  bytes.resize(static_cast<size_t>(length));
  std::ifstream in(path, std::ios::binary);
  in.seekg(offset);
  if (!in.read(bytes.data(), length)) refuse(dir, "'" + path.filename().string() + "' could not be read to the end");
}

// The value torch.save wrote in `storage`'s record.
c10::IValue read_record(const DcpFolder& folder, const DcpStorage& storage) {
  const std::string& name = storage.relative_path;
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
    refuse(folder.dir, "'" + storage.fqn + "' is stored at \"" + name + "\", which is not a file of the folder");
  }
  auto& bytes = folder.buffer;
  read_bytes(folder.dir / name, storage.offset, storage.length, folder.dir, bytes);
  const std::string where = "the record of '" + storage.fqn + "' in '" + name + "'";
  if (bytes.size() < 4 || std::string(bytes.data(), 4) != std::string("PK\x03\x04", 4)) {
    refuse(folder.dir, where + " is not a torch.save archive (FileSystemWriter's default serialization_format; "
                              "SAFETENSORS is not read)");
  }
  const std::string problem = detail::check_zip(bytes.data(), bytes.size());
  if (!problem.empty()) refuse(folder.dir, where + " is damaged: " + problem);
  const auto file = detail::read_torch_file(bytes);
  if (!file.problem.empty()) refuse(folder.dir, where + " " + (file.damaged ? "is damaged: " : "") + file.problem);
  return file.value;
}

// The Lockstep name of each tensor with elements (the table in dcp_checkpoint.h). Model keys
// lose "model." when every model tensor has it.
void map_keys(DcpFolder& folder) {
  bool all_prefixed = true;
  for (const auto& [fqn, item] : folder.metadata.items) {
    if (item.is_tensor && fqn.rfind("optim.", 0) != 0) all_prefixed = all_prefixed && fqn.rfind("model.", 0) == 0;
  }
  for (const auto& [fqn, item] : folder.metadata.items) {
    if (!item.is_tensor) continue;
    std::string key;
    if (fqn.rfind("optim.state.", 0) == 0) {
      if (item.size.empty()) continue;  // Adam's step: common
      const auto dot = fqn.rfind('.');
      const std::string parameter = fqn.substr(12, dot - 12);
      const auto k = folder.parameter_index.find(parameter);
      if (dot <= 12 || k == folder.parameter_index.end()) {
        refuse(folder.dir, "'" + fqn + "' is optimizer state of a parameter that optim.param_groups does not list");
      }
      key = "optimizer_states/0/state/" + std::to_string(k->second) + "/" + fqn.substr(dot + 1);
    } else if (fqn.rfind("optim.", 0) == 0) {
      refuse(folder.dir, "'" + fqn + "' is a tensor under optim. outside optim.state, which Lockstep has no place for");
    } else {
      key = "state_dict/" + (all_prefixed ? fqn.substr(6) : fqn);
    }
    folder.piece_of[fqn] = key;
    folder.fqn_of[key] = fqn;
  }
}

// The nested path a bytes item or tensor was flattened from: planner_data's, else read from its
// name ("optim.param_groups.0.lr", "optim.state.0.weight.step", "epoch").
detail::DcpPath path_of(const DcpFolder& folder, const std::string& fqn) {
  const auto it = folder.metadata.planner_data.find(fqn);
  if (it != folder.metadata.planner_data.end()) return it->second;
  const std::string groups = "optim.param_groups.", state = "optim.state.";
  const auto dot = fqn.rfind('.');
  if (fqn.rfind(groups, 0) == 0 && dot > groups.size()) {
    try {
      return {"optim", "param_groups", int64_t{std::stoll(fqn.substr(groups.size()))}, fqn.substr(dot + 1)};
    } catch (const std::logic_error&) {
    }
  }
  if (fqn.rfind(state, 0) == 0 && dot > state.size()) {
    return {"optim", "state", fqn.substr(state.size(), dot - state.size()), fqn.substr(dot + 1)};
  }
  return {fqn};
}

// Parameter fqn -> index k, from the "params" lists of optim.param_groups (as Python numbers them).
void read_parameter_names(DcpFolder& folder) {
  std::map<int64_t, std::vector<std::string>> groups;
  for (const auto& [fqn, storage] : folder.bytes) {
    const auto path = path_of(folder, fqn);
    const bool is_params = path.size() == 4 && path[0] == detail::DcpPath::value_type("optim") &&
                           path[1] == detail::DcpPath::value_type("param_groups") &&
                           path[3] == detail::DcpPath::value_type("params");
    if (!is_params) continue;
    const auto* g = std::get_if<int64_t>(&path[2]);
    const auto value = read_record(folder, storage);
    if (!g || !value.isList()) refuse(folder.dir, "'" + fqn + "' is not a list of parameter names");
    for (const auto& name : value.toListRef()) {
      if (!name.isString()) refuse(folder.dir, "'" + fqn + "' is not a list of parameter names");
      groups[*g].push_back(name.toStringRef());
    }
  }
  int64_t k = 0;
  for (const auto& [g, names] : groups) {
    for (const auto& name : names) folder.parameter_index.emplace(name, k++);
  }
}

// UsageError unless every chunk lies inside its tensor, has a record, and the chunks' volumes sum to
// the tensor's without two overlapping.
void check_item(const DcpFolder& folder, const std::string& fqn, const DcpItem& item) {
  int64_t volume = 0;
  for (size_t i = 0; i < item.chunks.size(); ++i) {
    const auto& c = item.chunks[i];
    bool inside = c.offsets.size() == item.size.size() && c.sizes.size() == item.size.size();
    int64_t n = 1;
    for (size_t d = 0; inside && d < c.offsets.size(); ++d) {
      inside = c.offsets[d] >= 0 && c.sizes[d] >= 0 && c.offsets[d] <= item.size[d] - c.sizes[d];
      n *= c.sizes[d];
    }
    if (!inside) refuse(folder.dir, "a chunk of '" + fqn + "' lies outside its shape " + detail::shape_text(item.size));
    if (!folder.chunks.count({fqn, c.offsets})) refuse(folder.dir, "a chunk of '" + fqn + "' has no record in storage_data");
    volume += n;
    for (size_t j = 0; j < i && n > 0; ++j) {
      const auto& o = item.chunks[j];
      bool overlap = true;
      for (size_t d = 0; overlap && d < c.offsets.size(); ++d) {
        overlap = c.offsets[d] < o.offsets[d] + o.sizes[d] && o.offsets[d] < c.offsets[d] + c.sizes[d];
      }
      if (overlap) refuse(folder.dir, "two chunks of '" + fqn + "' overlap");
    }
  }
  if (volume != detail::numel_of_shape(item.size)) {
    refuse(folder.dir, "the chunks of '" + fqn + "' hold " + std::to_string(volume) + " of its " +
                           std::to_string(detail::numel_of_shape(item.size)) + " elements");
  }
}

DcpFolder open_dcp(const std::string& path) {
  DcpFolder folder;
  folder.dir = detail::checkpoint_directory(path, "a DCP checkpoint");
  const fs::path metadata_path = folder.dir / detail::kDcpMetadata;
  std::error_code error;
  if (!fs::is_regular_file(metadata_path, error)) refuse(folder.dir, "there is no .metadata file in it");
  std::vector<char> bytes;
  read_bytes(metadata_path, 0, static_cast<int64_t>(fs::file_size(metadata_path, error)), folder.dir, bytes);
  auto read = detail::parse_dcp_metadata(bytes.data(), bytes.size());
  if (!read.problem.empty()) refuse(folder.dir, "its .metadata is not DCP's Metadata as Lockstep reads it: " + read.problem);
  folder.metadata = std::move(read.metadata);
  for (const auto& s : folder.metadata.storage) {
    if (s.has_offsets) {
      folder.chunks[{s.fqn, s.chunk_offsets}] = s;
    } else {
      folder.bytes[s.fqn] = s;
    }
  }
  for (const auto& [fqn, item] : folder.metadata.items) {
    if (item.is_tensor) {
      check_item(folder, fqn, item);
    } else if (!folder.bytes.count(fqn)) {
      refuse(folder.dir, "'" + fqn + "' has no record in storage_data");
    }
  }
  read_parameter_names(folder);
  map_keys(folder);
  return folder;
}

// Copies the elements of `chunk` (a box of a tensor of `shape`, its values `values`) that lie in
// the flat range [b, b + out.numel()) into `out`. The box is a set of runs contiguous in the
// flat order: one per index of its leading dimensions, down to the last that it does not cover whole.
void copy_chunk(const at::Tensor& values, const DcpChunk& chunk, const std::vector<int64_t>& shape, int64_t b,
                at::Tensor& out) {
  const int64_t e = b + out.numel();
  if (shape.empty()) {
    out.copy_(values.reshape({1}));
    return;
  }
  size_t k = shape.size() - 1;
  while (k > 0 && chunk.offsets[k] == 0 && chunk.sizes[k] == shape[k]) --k;
  std::vector<int64_t> inner(shape.size(), 1);
  for (size_t d = shape.size() - 1; d > 0; --d) inner[d - 1] = inner[d] * shape[d];
  const int64_t run = chunk.sizes[k] * inner[k];
  if (run == 0) return;
  const auto flat = values.reshape({-1});
  std::vector<int64_t> index(k, 0);
  for (int64_t r = 0; r * run < flat.numel(); ++r) {
    int64_t start = chunk.offsets[k] * inner[k];
    for (size_t d = 0; d < k; ++d) start += (chunk.offsets[d] + index[d]) * inner[d];
    const int64_t lo = std::max(start, b), hi = std::min(start + run, e);
    if (lo < hi) out.narrow(0, lo - b, hi - lo).copy_(flat.narrow(0, r * run + lo - start, hi - lo));
    for (size_t d = k; d-- > 0;) {  // the next index of the leading dimensions
      if (++index[d] < chunk.sizes[d]) break;
      index[d] = 0;
    }
  }
}

// Whether the box `chunk` of a tensor of `shape` has elements in the flat range [b, e).
bool overlaps(const DcpChunk& chunk, const std::vector<int64_t>& shape, int64_t b, int64_t e) {
  int64_t first = 0, last = 0, inner = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    if (chunk.sizes[d] == 0) return false;
    first += chunk.offsets[d] * inner;
    last += (chunk.offsets[d] + chunk.sizes[d] - 1) * inner;
    inner *= shape[d];
  }
  return first < e && last >= b;
}

at::Tensor read_piece(const DcpFolder& folder, const std::string& fqn, const PieceRange& range, const at::Tensor& into) {
  const auto& item = folder.metadata.items.at(fqn);
  const bool fits = into.defined() && into.dim() == 1 && into.numel() == range.numel && into.scalar_type() == item.dtype &&
                    into.device().is_cpu() && into.is_contiguous();
  auto out = fits ? into : at::empty({range.numel}, at::TensorOptions().dtype(item.dtype));
  for (const auto& chunk : item.chunks) {
    if (range.numel == 0 || !overlaps(chunk, item.size, range.begin, range.begin + range.numel)) continue;
    const auto value = read_record(folder, folder.chunks.at({fqn, chunk.offsets}));
    if (!value.isTensor() || value.toTensor().sizes().vec() != chunk.sizes || value.toTensor().scalar_type() != item.dtype) {
      refuse(folder.dir, "the record of a chunk of '" + fqn + "' is not a tensor of its chunk's sizes " +
                             detail::shape_text(chunk.sizes) + " and dtype " + detail::dtype_name(item.dtype));
    }
    copy_chunk(value.toTensor(), chunk, item.size, range.begin, out);
  }
  return out;
}

// Optimizer 0's dict in Lockstep's layout, filled as the scalar state and param_groups are read.
struct OptimizerParts {
  c10::impl::GenericDict state{c10::IntType::get(), c10::AnyType::get()};
  std::map<int64_t, c10::impl::GenericDict> groups;
  bool any = false;
};

// Puts a non-piece value of optimizer state or param_groups where Lockstep keeps it; false for
// a value outside the optimizer.
bool add_optimizer_value(const DcpFolder& folder, const std::string& fqn, c10::IValue value, OptimizerParts& parts) {
  const auto path = path_of(folder, fqn);
  const auto* top = path.size() == 4 ? std::get_if<std::string>(&path[0]) : nullptr;
  const auto* what = path.size() == 4 ? std::get_if<std::string>(&path[1]) : nullptr;
  const auto* field = path.size() == 4 ? std::get_if<std::string>(&path[3]) : nullptr;
  if (!top || *top != "optim" || !what || !field) return false;
  parts.any = true;
  if (*what == "state" && std::holds_alternative<std::string>(path[2])) {
    const auto k = folder.parameter_index.find(std::get<std::string>(path[2]));
    if (k == folder.parameter_index.end()) refuse(folder.dir, "'" + fqn + "' is state of a parameter no param_group lists");
    if (!parts.state.contains(k->second)) parts.state.insert(k->second, c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()));
    parts.state.at(k->second).toGenericDict().insert_or_assign(*field, value);
    return true;
  }
  const auto* g = std::get_if<int64_t>(&path[2]);
  if (*what != "param_groups" || !g) return false;
  if (*field == "params") {
    c10::impl::GenericList indices(c10::AnyType::get());
    for (const auto& name : value.toListRef()) indices.push_back(folder.parameter_index.at(name.toStringRef()));
    value = indices;
  }
  auto group = parts.groups.try_emplace(*g, c10::StringType::get(), c10::AnyType::get()).first;
  group->second.insert_or_assign(*field, value);
  return true;
}

// Everything but the pieces: the bytes items and the optimizer's 0-dim state, in Lockstep's layout.
Checkpoint common_of(const DcpFolder& folder) {
  Checkpoint common = make_checkpoint();
  OptimizerParts parts;
  for (const auto& [fqn, storage] : folder.bytes) {
    auto value = read_record(folder, storage);
    if (!add_optimizer_value(folder, fqn, value, parts)) common.insert_or_assign(fqn, value);
  }
  for (const auto& [fqn, item] : folder.metadata.items) {
    if (!item.is_tensor || folder.piece_of.count(fqn)) continue;
    const auto value = read_piece(folder, fqn, {0, detail::numel_of_shape(item.size)}, at::Tensor()).reshape(item.size);
    if (!add_optimizer_value(folder, fqn, value, parts)) refuse(folder.dir, "'" + fqn + "' has no place in Lockstep's layout");
  }
  if (!parts.any) return common;
  c10::impl::GenericDict optimizer(c10::StringType::get(), c10::AnyType::get());
  optimizer.insert("state", parts.state);
  c10::impl::GenericList groups(c10::AnyType::get());
  for (const auto& [g, group] : parts.groups) groups.push_back(group);
  optimizer.insert("param_groups", groups);
  c10::impl::GenericList optimizers(c10::AnyType::get());
  optimizers.push_back(optimizer);
  common.insert_or_assign("optimizer_states", optimizers);
  return common;
}

}  // namespace

std::vector<std::string> read_dcp_parameter_names(const std::string& dir) {
  const DcpFolder folder = open_dcp(dir);
  std::vector<std::string> names(folder.parameter_index.size());
  for (const auto& [name, k] : folder.parameter_index) names[static_cast<size_t>(k)] = name;
  return names;
}

ShardedCheckpoint load_dcp_pieces(const std::string& dir, const std::map<std::string, PieceRange>& wanted,
                                  const std::map<std::string, at::Tensor>& into) {
  const DcpFolder folder = open_dcp(dir);
  ShardedCheckpoint out;
  out.common = common_of(folder);
  for (const auto& [key, range] : wanted) {
    const auto fqn = folder.fqn_of.find(key);
    if (fqn == folder.fqn_of.end()) {
      refuse(folder.dir, "it holds no tensor for \"" + key + "\" (DCP's name for it: " +
                             (key.rfind("state_dict/", 0) == 0 ? "model." + key.substr(11) : "optim.state.<name>.<field>") +
                             "). Resume with the model and optimizer that saved it");
    }
    const auto& item = folder.metadata.items.at(fqn->second);
    detail::check_piece_range("load_dcp_pieces", key, range, detail::numel_of_shape(item.size), item.size);
    const auto target = into.find(key);
    out.pieces[key] = {item.size, range.begin,
                       read_piece(folder, fqn->second, range, target == into.end() ? at::Tensor() : target->second)};
  }
  return out;
}

ReassembledCheckpoint load_dcp(const std::string& dir) {
  std::map<std::string, PieceRange> wanted;
  for (const auto& [key, info] : read_dcp_tensors(dir)) wanted[key] = {0, detail::numel_of_shape(info.shape)};
  auto pieces = load_dcp_pieces(dir, wanted);
  ReassembledCheckpoint out;
  out.common = pieces.common;
  for (auto& [key, piece] : pieces.pieces) out.tensors[key] = piece.values.reshape(piece.shape);
  return out;
}

bool is_dcp_checkpoint(const std::string& path) {
  std::error_code error;
  return !path.empty() && fs::is_directory(path, error) && fs::is_regular_file(fs::path(path) / detail::kDcpMetadata, error);
}

std::map<std::string, ShardedTensorInfo> read_dcp_tensors(const std::string& dir) {
  const DcpFolder folder = open_dcp(dir);
  std::map<std::string, ShardedTensorInfo> out;
  for (const auto& [fqn, key] : folder.piece_of) {
    const auto& item = folder.metadata.items.at(fqn);
    out[key] = {item.size, item.dtype, {}};
  }
  return out;
}

}  // namespace checkpoint
}  // namespace lockstep
