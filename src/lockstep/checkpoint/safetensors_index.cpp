#include "safetensors_index.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <vector>

#include <nlohmann/json.hpp>

#include <lockstep/core/error.h>

#include "atomic_file.h"

namespace lockstep {
namespace checkpoint {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kIndexEnding = ".safetensors.index.json";
// No index of a real model comes near it (a 1000-layer model's holds some 200 kB).
constexpr std::uintmax_t kMaxIndexBytes = 100'000'000;

[[noreturn]] void bad_index(const std::string& path, const std::string& problem) {
  throw UsageError("safetensors index '" + path + "' is damaged or not an index: " + problem +
                   ". It cannot be loaded: write the model again (Python: model.save_pretrained(folder)), or pass "
                   "another file.");
}

json read_index(const std::string& path) {
  std::error_code error;
  if (!fs::is_regular_file(path, error)) {
    throw UsageError("safetensors index '" + path + "' does not exist (or is not a file). Pass the path of a "
                     ".safetensors file, or of a sharded model's .safetensors.index.json.");
  }
  const auto size = fs::file_size(path, error);
  if (error || size > kMaxIndexBytes) bad_index(path, "it is over " + std::to_string(kMaxIndexBytes) + " bytes");
  std::ifstream in(path, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.good() && !in.eof()) {
    throw UsageError("safetensors index '" + path + "' cannot be read. Check its permissions, or pass another file.");
  }
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    bad_index(path, std::string("it is not JSON (") + e.what() + ")");
  }
}

// A shard's name as the index gives it: a file in the index's own folder.
bool plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

std::string shard_name(const std::string& stem, std::size_t number, std::size_t count) {
  char digits[32];
  std::snprintf(digits, sizeof(digits), "-%05zu-of-%05zu", number, count);
  return stem + digits + ".safetensors";
}

// Shard -> the names the index puts in it.
std::map<std::string, std::set<std::string>> shard_names(const json& index, const std::string& index_path) {
  if (!index.is_object()) bad_index(index_path, "it is not a JSON object");
  const auto weight_map = index.find("weight_map");
  if (weight_map == index.end() || !weight_map->is_object()) bad_index(index_path, "it has no \"weight_map\" object");
  std::map<std::string, std::set<std::string>> names_of;
  for (const auto& [name, shard] : weight_map->items()) {
    if (!shard.is_string() || !plain_file_name(shard.get<std::string>())) {
      bad_index(index_path, "its weight_map puts '" + name + "' in " + shard.dump() +
                                ", which is not a file name in the index's folder");
    }
    names_of[shard.get<std::string>()].insert(name);
  }
  return names_of;
}

}  // namespace

namespace detail {

std::vector<std::string> shards_of_index(const std::string& index_path) {
  std::vector<std::string> paths;
  for (const auto& item : shard_names(read_index(index_path), index_path)) {
    paths.push_back((fs::path(index_path).parent_path() / item.first).string());
  }
  return paths;
}

Safetensors load_sharded_safetensors(const std::string& index_path) {
  const json index = read_index(index_path);
  const auto names_of = shard_names(index, index_path);
  Safetensors out;
  if (const auto metadata = index.find("metadata"); metadata != index.end()) {
    if (!metadata->is_object()) bad_index(index_path, "its \"metadata\" is not an object");
    for (const auto& [key, value] : metadata->items()) {
      out.metadata[key] = value.is_string() ? value.get<std::string>() : value.dump();
    }
  }
  const fs::path folder = fs::path(index_path).parent_path();
  for (const auto& [shard, names] : names_of) {  // every shard there before any is read
    std::error_code error;
    if (!fs::exists(folder / shard, error)) {
      bad_index(index_path, "its shard '" + shard + "' (of '" + *names.begin() + "') is not in " +
                                (folder.empty() ? std::string("the current folder") : "'" + folder.string() + "'"));
    }
  }
  std::map<std::string, at::Tensor> tensors;
  for (const auto& [shard, names] : names_of) {
    const Safetensors part = load_safetensors((folder / shard).string());
    for (const auto& item : part.tensors) {
      if (!names.count(item.key())) {
        bad_index(index_path, "shard '" + shard + "' holds '" + item.key() + "', which the weight_map does not put there");
      }
      tensors.emplace(item.key(), item.value());
    }
    for (const auto& name : names) {
      if (!part.tensors.contains(name)) {
        bad_index(index_path, "its weight_map puts '" + name + "' in shard '" + shard + "', which does not hold it");
      }
    }
  }
  for (const auto& [name, tensor] : tensors) out.tensors.insert(name, tensor);
  return out;
}

}  // namespace detail

bool is_safetensors_index_path(const std::string& path) {
  return path.size() > kIndexEnding.size() &&
         path.compare(path.size() - kIndexEnding.size(), kIndexEnding.size(), kIndexEnding) == 0;
}

std::string safetensors_shard_path(const std::string& index_path, std::size_t number, std::size_t count) {
  if (!is_safetensors_index_path(index_path)) {
    throw UsageError("saving sharded safetensors: the index '" + index_path + "' must end in " + kIndexEnding +
                     " (model.safetensors.index.json), as transformers names it; its shards take its name's stem.");
  }
  const fs::path index(index_path);
  const std::string file = index.filename().string();
  return (index.parent_path() / shard_name(file.substr(0, file.size() - kIndexEnding.size()), number, count)).string();
}

void write_safetensors_index(const std::string& index_path, const std::vector<std::string>& shard_paths) {
  std::map<std::string, std::string> weight_map;  // sorted by name, as transformers' sort_keys
  uint64_t total = 0;
  for (const auto& shard : shard_paths) {
    const std::string name = fs::path(shard).filename().string();
    for (const auto& item : load_safetensors(shard).tensors) {  // mapped, not read: the header and sizes
      const auto [it, added] = weight_map.emplace(item.key(), name);
      if (!added) {
        throw UsageError("safetensors index '" + index_path + "': '" + item.key() + "' is in shard '" + it->second +
                         "' and in '" + name + "'. Save each tensor in one shard.");
      }
      total += static_cast<uint64_t>(item.value().numel()) * item.value().element_size();
    }
  }
  // As transformers writes it: json.dumps(index, indent=2, sort_keys=True) and a newline.
  const nlohmann::ordered_json document = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  const std::string text = document.dump(2) + "\n";
  detail::write_atomically(index_path, "saving safetensors index",
                           [&](const detail::WriteBytes& write) { write(text.data(), text.size()); });
}

void save_sharded_safetensors(const c10::Dict<std::string, at::Tensor>& tensors, const std::string& index_path,
                              int64_t max_shard_bytes, const std::map<std::string, std::string>& metadata) {
  safetensors_shard_path(index_path, 1, 1);  // refuses a path that is no index
  if (max_shard_bytes < 1) {
    throw UsageError("saving sharded safetensors '" + index_path + "': max_shard_bytes is " +
                     std::to_string(max_shard_bytes) + "; give a positive size, e.g. 5000000000 (5 GB, transformers' default).");
  }
  std::map<std::string, at::Tensor> sorted;
  for (const auto& item : tensors) sorted.emplace(item.key(), item.value());
  std::vector<c10::Dict<std::string, at::Tensor>> shards;
  int64_t filled = 0;
  for (const auto& [name, tensor] : sorted) {
    const int64_t bytes = tensor.defined() ? tensor.numel() * static_cast<int64_t>(tensor.element_size()) : 0;
    if (shards.empty() || (filled > 0 && filled + bytes > max_shard_bytes)) {
      shards.emplace_back();
      filled = 0;
    }
    shards.back().insert(name, tensor);
    filled += bytes;
  }
  std::vector<std::string> paths;
  for (std::size_t i = 0; i < shards.size(); ++i) {
    paths.push_back(safetensors_shard_path(index_path, i + 1, shards.size()));
    save_safetensors(shards[i], paths.back(), metadata);
  }
  write_safetensors_index(index_path, paths);
}

}  // namespace checkpoint
}  // namespace lockstep
