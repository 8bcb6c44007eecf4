#pragma once
// The `.metadata` file of a torch.distributed.checkpoint (DCP) folder: a Python pickle of
// torch.distributed.checkpoint.metadata.Metadata, as FileSystemWriter.finish writes it (PyTorch
// 2.15, torch/distributed/checkpoint/metadata.py and filesystem.py). Read by a pickle machine of
// its own that knows exactly those dataclasses (and torch.Size, torch's dtypes, the layout and
// pathlib's paths they hold) and refuses every other global; written as a pickle that Python's
// unpickler turns back into those dataclasses.

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include <c10/core/ScalarType.h>

namespace lockstep {
namespace checkpoint {
namespace detail {

/// ChunkStorageMetadata: a box of a tensor, `sizes` elements from `offsets`, one per dimension.
struct DcpChunk {
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;
};

/// TensorStorageMetadata (the dtype of its TensorProperties, its size and chunks), or, with
/// `is_tensor` false, BytesStorageMetadata: a torch.save'd Python object.
struct DcpItem {
  bool is_tensor = false;
  c10::ScalarType dtype = c10::ScalarType::Float;
  std::vector<int64_t> size;
  std::vector<DcpChunk> chunks;
};

/// One entry of storage_data: MetadataIndex(fqn, offset) -> _StorageInfo(relative_path, offset,
/// length). `chunk_offsets` is the MetadataIndex's offset: set for a tensor's chunk (empty for a
/// 0-dim tensor), absent (`has_offsets` false) for a bytes item.
struct DcpStorage {
  std::string fqn;
  bool has_offsets = false;
  std::vector<int64_t> chunk_offsets;
  std::string relative_path;
  int64_t offset = 0;
  int64_t length = 0;
};

/// planner_data: for each fqn, the path of keys in the nested state_dict it was flattened from
/// (("optim", "param_groups", 0, "lr")): strings, and ints for list indices.
using DcpPath = std::vector<std::variant<std::string, int64_t>>;

/// What Lockstep reads of, and writes to, a Metadata.
struct DcpMetadata {
  std::map<std::string, DcpItem> items;  ///< state_dict_metadata
  std::vector<DcpStorage> storage;       ///< storage_data
  std::map<std::string, DcpPath> planner_data;
  std::string version;                   ///< "1.0.0" in 2.15; absent before 2.4
};

/// The Metadata pickled in `data`, or `problem` (a clause: "its pickle ... names the global ...").
struct DcpMetadataRead {
  DcpMetadata metadata;
  std::string problem;
};

/// Reads a `.metadata` pickle (protocols 2 to 5). Every read is bounded by `size`; globals other
/// than the dataclasses above are refused by name; nesting, memo and stack are checked; an
/// extension's transform_descriptors (compression) are refused as unsupported.
DcpMetadataRead parse_dcp_metadata(const char* data, std::size_t size);

/// A pickle (protocol 2) of `metadata` that Python's pickle.load turns into DCP's Metadata, with
/// storage_meta None (FileSystemReader.read_metadata fills one in).
std::string write_dcp_metadata(const DcpMetadata& metadata);

}  // namespace detail
}  // namespace checkpoint
}  // namespace lockstep
