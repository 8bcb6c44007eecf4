// Reading a sharded checkpoint: whole (load_sharded) or in the pieces of a new layout
// (load_sharded_pieces), each file checked against metadata.json.

#include <lockstep/checkpoint/sharded_checkpoint.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <utility>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <lockstep/core/error.h>

#include "sharded_format.h"

namespace lockstep {
namespace checkpoint {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Dict = c10::impl::GenericDict;

[[noreturn]] void bad_sharded_checkpoint(const fs::path& path, const std::string& why) {
  throw UsageError("sharded checkpoint '" + path.string() + "' cannot be loaded: " + why +
                   ". Pass a sharded checkpoint that a save completed (a directory with metadata.json and one "
                   "rank_<r>.ckpt per rank), or an earlier checkpoint.");
}

ShardedMetadata parse_metadata(const fs::path& path) {
  ShardedMetadata metadata;
  const auto bad = [&](const std::string& why) { bad_sharded_checkpoint(path, "metadata.json " + why); };
  try {
    const json root = json::parse(detail::read_text_file(path));
    if (root.value("format", "") != detail::kShardedFormat) bad("is not that of a Lockstep sharded checkpoint");
    metadata.version = root.at("version").get<int>();
    if (metadata.version != detail::kShardedVersion) {
      bad("has format version " + std::to_string(metadata.version) + "; this Lockstep reads version " +
          std::to_string(detail::kShardedVersion) + " (use the Lockstep that wrote it)");
    }
    metadata.world_size = root.at("world_size").get<int>();
    if (metadata.world_size < 1) bad("has world_size " + std::to_string(metadata.world_size));
    for (const auto& item : root.at("tensors").items()) {
      const json& entry = item.value();
      ShardedTensorInfo info;
      info.shape = entry.at("shape").get<std::vector<int64_t>>();
      const auto dtype = entry.at("dtype").get<std::string>();
      if (!detail::parse_dtype(dtype, info.dtype)) bad("gives \"" + item.key() + "\" the unknown dtype " + dtype);
      for (const auto& range : entry.at("ranks")) {
        info.ranks.push_back({range.at("begin").get<int64_t>(), range.at("numel").get<int64_t>()});
      }
      if (static_cast<int>(info.ranks.size()) != metadata.world_size) {
        bad("lists " + std::to_string(info.ranks.size()) + " ranks for \"" + item.key() + "\" but world_size " +
            std::to_string(metadata.world_size));
      }
      const std::string problem = detail::coverage_problem(info.ranks, detail::numel_of_shape(info.shape));
      if (!problem.empty()) bad("gives wrong pieces of \"" + item.key() + "\": " + problem);
      metadata.tensors.emplace(item.key(), std::move(info));
    }
  } catch (const json::exception& e) {
    bad(std::string("is damaged (") + e.what() + ")");
  }
  return metadata;
}

// The rank r of a file named rank_<r>.ckpt; -1 for any other name.
int rank_of_file_name(const std::string& name) {
  const std::string prefix = "rank_", suffix = ".ckpt";
  if (name.size() <= prefix.size() + suffix.size() || name.compare(0, prefix.size(), prefix) != 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return -1;
  }
  const std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  const bool number =
      digits.size() <= 9 && std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
  return number ? std::stoi(digits) : -1;
}

// A rank file's common dict and its pieces' values by key, checked against metadata.json.
struct RankFile {
  Checkpoint common = make_checkpoint();
  std::map<std::string, at::Tensor> values;
};

RankFile read_rank_file(const fs::path& dir, int rank, const ShardedMetadata& metadata) {
  const fs::path path = dir / detail::rank_file_name(rank);
  if (!fs::exists(path)) {
    bad_sharded_checkpoint(dir, detail::rank_file_name(rank) + " is missing (metadata.json says world_size " +
                                    std::to_string(metadata.world_size) +
                                    ": one rank_<r>.ckpt for each r below it); copy the whole directory");
  }
  const Checkpoint file = CheckpointIO().load(path.string());  // UsageError naming the file if damaged
  const auto wrong = [&](const std::string& why) {
    bad_sharded_checkpoint(path, why + "; it does not belong with this metadata.json");
  };
  RankFile out;
  try {
    if (!file.contains("format") || !file.at("format").isString() ||
        file.at("format").toStringRef() != detail::kShardedFormat) {
      wrong("it is not a rank file");
    }
    if (file.at("rank").toInt() != rank) wrong("it holds rank " + std::to_string(file.at("rank").toInt()));
    if (file.at("world_size").toInt() != metadata.world_size) {
      wrong("it was written with world_size " + std::to_string(file.at("world_size").toInt()) +
            " but metadata.json says " + std::to_string(metadata.world_size));
    }
    out.common = file.at("common").toGenericDict();
    for (const auto& entry : file.at("pieces").toGenericDict()) {
      const std::string key = entry.key().toStringRef();
      const Dict piece = entry.value().toGenericDict();
      const auto info = metadata.tensors.find(key);
      if (info == metadata.tensors.end()) wrong("it has a piece of \"" + key + "\", which metadata.json lacks");
      std::vector<int64_t> shape;
      for (const auto& size : piece.at("shape").toListRef()) shape.push_back(size.toInt());
      const at::Tensor values = piece.at("values").toTensor();
      const PieceRange expected = info->second.ranks[rank];
      const int64_t begin = piece.at("begin").toInt();
      if (values.numel() == 0 && expected.numel == 0) continue;
      if (shape != info->second.shape || values.dim() != 1 || values.scalar_type() != info->second.dtype ||
          begin != expected.begin || values.numel() != expected.numel) {
        wrong("its piece of \"" + key + "\" is " + detail::range_text(begin, values.numel()) + " of " +
              detail::shape_text(shape) + " " + detail::dtype_name(values.scalar_type()) + ", metadata.json says " +
              detail::range_text(expected.begin, expected.numel) + " of " + detail::shape_text(info->second.shape) +
              " " + detail::dtype_name(info->second.dtype));
      }
      out.values.emplace(key, values);
    }
  } catch (const c10::Error& e) {
    wrong(std::string("its contents are not laid out as a rank file (") + e.what_without_backtrace() + ")");
  }
  for (const auto& [key, info] : metadata.tensors) {
    const PieceRange held = info.ranks[rank];
    if (held.numel > 0 && out.values.count(key) == 0) {
      wrong("it lacks its piece " + detail::range_text(held.begin, held.numel) + " of \"" + key + "\"");
    }
  }
  return out;
}

}  // namespace

bool is_sharded_checkpoint(const std::string& path) {
  std::error_code error;
  return !path.empty() && fs::is_directory(path, error) && fs::exists(fs::path(path) / detail::kShardedMetadata, error);
}

ShardedMetadata read_sharded_metadata(const std::string& dir) {
  const fs::path path = detail::checkpoint_directory(dir, "read_sharded_metadata");
  std::error_code error;
  if (!fs::exists(path, error)) {
    const fs::path old = detail::sibling_path(path, ".old");
    std::string why = "it does not exist";
    if (fs::exists(old / detail::kShardedMetadata, error)) {
      why += "; a save that was interrupted moved it to '" + old.string() +
             "' (the next save to it moves it back, or rename it yourself)";
    } else if (fs::exists(detail::sibling_path(path, ".tmp"), error)) {
      why += " (a save to it was interrupted before it completed)";
    }
    bad_sharded_checkpoint(path, why);
  }
  if (!fs::is_directory(path, error)) {
    bad_sharded_checkpoint(path,
                           "it is a file, not a directory; a single-file checkpoint loads with CheckpointIO::load");
  }
  if (!fs::exists(path / detail::kShardedMetadata, error)) {
    bad_sharded_checkpoint(path,
                           "it has no metadata.json, which a save writes last: the save did not complete, or "
                           "this is another kind of directory");
  }
  ShardedMetadata metadata = parse_metadata(path / detail::kShardedMetadata);
  for (const auto& entry : fs::directory_iterator(path, error)) {
    const std::string name = entry.path().filename().string();
    if (rank_of_file_name(name) >= metadata.world_size) {
      bad_sharded_checkpoint(path, "it holds " + name + " but metadata.json says world_size " +
                                       std::to_string(metadata.world_size) + ", so files of different saves are mixed");
    }
  }
  return metadata;
}

ReassembledCheckpoint load_sharded(const std::string& dir) {
  const ShardedMetadata metadata = read_sharded_metadata(dir);
  const fs::path path = detail::checkpoint_directory(dir, "load_sharded");
  ReassembledCheckpoint out;
  for (const auto& [key, info] : metadata.tensors) {
    out.tensors[key] = at::empty({detail::numel_of_shape(info.shape)}, info.dtype);
  }
  for (int r = 0; r < metadata.world_size; ++r) {
    const RankFile file = read_rank_file(path, r, metadata);
    if (r == 0) out.common = file.common;
    for (const auto& [key, values] : file.values) {
      out.tensors[key].narrow(0, metadata.tensors.at(key).ranks[r].begin, values.numel()).copy_(values);
    }
  }
  for (auto& [key, tensor] : out.tensors) tensor = tensor.view(metadata.tensors.at(key).shape);
  return out;
}

ShardedCheckpoint load_sharded_pieces(const std::string& dir, const std::map<std::string, PieceRange>& wanted) {
  const ShardedMetadata metadata = read_sharded_metadata(dir);
  const fs::path path = detail::checkpoint_directory(dir, "load_sharded_pieces");
  ShardedCheckpoint out;
  std::vector<bool> needed(metadata.world_size, false);
  needed[0] = true;  // rank 0's file holds the common dict
  for (const auto& [key, range] : wanted) {
    const auto info = metadata.tensors.find(key);
    if (info == metadata.tensors.end()) {
      throw UsageError("load_sharded_pieces: sharded checkpoint '" + path.string() + "' has no tensor \"" + key +
                       "\" (it has " + std::to_string(metadata.tensors.size()) +
                       "). Resume with the model and optimizer that wrote it.");
    }
    const auto& [shape, dtype, ranks] = info->second;
    detail::check_piece_range("load_sharded_pieces", key, range, detail::numel_of_shape(shape), shape);
    out.pieces[key] = {shape, range.begin, at::empty({range.numel}, dtype)};
    for (int r = 0; r < metadata.world_size; ++r) {
      const int64_t lo = std::max(ranks[r].begin, range.begin);
      if (lo < std::min(ranks[r].begin + ranks[r].numel, range.begin + range.numel)) needed[r] = true;
    }
  }
  for (int r = 0; r < metadata.world_size; ++r) {
    if (!needed[r]) continue;
    const RankFile file = read_rank_file(path, r, metadata);
    if (r == 0) out.common = file.common;
    for (auto& [key, piece] : out.pieces) {
      const PieceRange held = metadata.tensors.at(key).ranks[r];
      const int64_t lo = std::max(held.begin, piece.begin);
      const int64_t hi = std::min(held.begin + held.numel, piece.begin + piece.values.numel());
      if (lo >= hi) continue;
      piece.values.narrow(0, lo - piece.begin, hi - lo).copy_(file.values.at(key).narrow(0, lo - held.begin, hi - lo));
    }
  }
  return out;
}

std::map<std::string, TensorPiece> cut_pieces(const std::map<std::string, at::Tensor>& full,
                                              const std::map<std::string, PieceRange>& wanted) {
  std::map<std::string, TensorPiece> out;
  for (const auto& [key, range] : wanted) {
    const auto tensor = full.find(key);
    if (tensor == full.end()) {
      throw UsageError("cut_pieces: no full tensor \"" + key + "\" among the " + std::to_string(full.size()) +
                       " given. Pass a full tensor for every key of the wanted ranges.");
    }
    const auto shape = tensor->second.sizes().vec();
    detail::check_piece_range("cut_pieces", key, range, tensor->second.numel(), shape);
    out[key] = {shape, range.begin, tensor->second.reshape({-1}).narrow(0, range.begin, range.numel).clone()};
  }
  return out;
}

}  // namespace checkpoint
}  // namespace lockstep
