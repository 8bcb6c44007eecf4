#pragma once
// Hugging Face's sharded safetensors: the index `<name>.safetensors.index.json` and its shards.

#include <string>
#include <vector>

#include <lockstep/checkpoint/safetensors.h>

namespace lockstep {
namespace checkpoint {
namespace detail {

/// The tensors of every shard that the index at `index_path` names, checked against its
/// weight_map; the index's "metadata".
Safetensors load_sharded_safetensors(const std::string& index_path);

/// The paths of the shards the index at `index_path` names (each once), checked as above.
std::vector<std::string> shards_of_index(const std::string& index_path);

}  // namespace detail
}  // namespace checkpoint
}  // namespace lockstep
