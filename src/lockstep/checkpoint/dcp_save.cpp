// Writing a DCP checkpoint (dcp_checkpoint.h): write_dcp_shard on every rank, commit_dcp_save on
// rank 0.

#include <lockstep/checkpoint/dcp_checkpoint.h>

#include <algorithm>
#include <filesystem>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <lockstep/core/error.h>

#include "atomic_file.h"
#include "dcp_metadata.h"
#include "sharded_format.h"
#include "torch_file.h"

namespace lockstep {
namespace checkpoint {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using detail::DcpChunk;
using detail::DcpPath;

constexpr const char* kDcpVersion = "1.0.0";  // CURRENT_DCP_VERSION of PyTorch 2.15
constexpr const char* kOneOptimizer =
    "a DCP checkpoint holds one optimizer (get_state_dict's \"optim\"). Save runs with several optimizers in "
    "Lockstep's sharded format (StateDictType::sharded).";

// A box of a tensor that a flat range covers, and where its elements start in the range.
struct FlatBox {
  DcpChunk chunk;
  int64_t start = 0;
  int64_t numel = 0;
};

int64_t inner_numel(const std::vector<int64_t>& shape, size_t dim) {
  int64_t n = 1;
  for (size_t d = dim + 1; d < shape.size(); ++d) n *= shape[d];
  return n;
}

// The boxes of [b, e) within the sub-tensor at `prefix` (its leading indices): a partial first
// row, the whole rows, a partial last row; the partial ones cut again one dimension down. Each box
// is contiguous in the flat order, so its elements are one slice of the range.
void add_boxes(const std::vector<int64_t>& shape, std::vector<int64_t> prefix, int64_t b, int64_t e, int64_t& start,
               std::vector<FlatBox>& out) {
  if (b >= e) return;
  const size_t dim = prefix.size();
  const int64_t inner = inner_numel(shape, dim);
  const auto box = [&](int64_t row, int64_t rows) {
    FlatBox f;
    f.chunk.offsets = prefix;
    f.chunk.offsets.push_back(row);
    f.chunk.sizes.assign(dim, 1);
    f.chunk.sizes.push_back(rows);
    for (size_t d = dim + 1; d < shape.size(); ++d) {
      f.chunk.offsets.push_back(0);
      f.chunk.sizes.push_back(shape[d]);
    }
    f.start = start;
    f.numel = rows * inner;
    start += f.numel;
    out.push_back(std::move(f));
  };
  int64_t row = b / inner;
  if (b % inner != 0 || (e - b) < inner) {  // a partial row first
    const int64_t end = std::min(e, (row + 1) * inner);
    auto next = prefix;
    next.push_back(row);
    add_boxes(shape, next, b - row * inner, end - row * inner, start, out);
    b = end;
    row = b / inner;
  }
  const int64_t full_rows = e / inner - row;
  if (b < e && full_rows > 0) {
    box(row, full_rows);
    b += full_rows * inner;
    row += full_rows;
  }
  if (b < e) {
    prefix.push_back(row);
    add_boxes(shape, prefix, 0, e - b, start, out);
  }
}

std::vector<FlatBox> boxes_of_range(const std::vector<int64_t>& shape, int64_t begin, int64_t numel) {
  std::vector<FlatBox> out;
  if (shape.empty()) {
    if (numel == 1) out.push_back({{{}, {}}, 0, 1});
    return out;
  }
  int64_t start = 0;
  add_boxes(shape, {}, begin, begin + numel, start, out);
  return out;
}

json path_json(const DcpPath& path) {
  json out = json::array();
  for (const auto& part : path) {
    if (const auto* s = std::get_if<std::string>(&part)) {
      out.push_back(*s);
    } else {
      out.push_back(std::get<int64_t>(part));
    }
  }
  return out;
}

// Appends torch.save archives to a rank's .distcp file and lists them in its index.
class ShardFile {
 public:
  ShardFile(const detail::WriteBytes& write, json& index) : write_(write), index_(index) {}

  void tensor(const std::string& fqn, const DcpPath& path, const std::vector<int64_t>& size, const DcpChunk& chunk,
              const at::Tensor& values) {
    json entry = record(values, fqn, path);
    entry["tensor"] = true;
    entry["dtype"] = detail::dtype_name(values.scalar_type());
    entry["size"] = size;
    entry["offsets"] = chunk.offsets;
    entry["sizes"] = chunk.sizes;
    index_.push_back(entry);
  }
  void bytes(const std::string& fqn, const DcpPath& path, const c10::IValue& value) {
    json entry = record(value, fqn, path);
    entry["tensor"] = false;
    index_.push_back(entry);
  }

 private:
  json record(const c10::IValue& value, const std::string& fqn, const DcpPath& path) {
    const auto length = static_cast<int64_t>(detail::torch_save(value, write_));
    json entry = {{"fqn", fqn}, {"path", path_json(path)}, {"offset", at_}, {"length", length}};
    at_ += length;
    return entry;
  }

  const detail::WriteBytes& write_;
  json& index_;
  int64_t at_ = 0;
};

// The DCP name of the parameter `k` of optimizer 0, or UsageError.
const std::string& parameter_name(const std::vector<std::string>& names, int64_t k, const std::string& key) {
  LOCKSTEP_CHECK(k >= 0 && k < static_cast<int64_t>(names.size()), UsageError, "write_dcp_shard: \"", key,
                 "\" belongs to the optimizer's parameter ", k, ", and only ", names.size(),
                 " parameter names were given. Pass the name of every parameter of the optimizer, in its order.");
  return names[k];
}

// A piece key's DCP name and path (the table in dcp_checkpoint.h), or UsageError.
std::pair<std::string, DcpPath> dcp_name_of_piece(const std::string& key, const std::vector<std::string>& names) {
  const auto parts = detail::split_piece_key(key, "write_dcp_shard");
  if (parts.size() == 2 && parts[0] == "state_dict") return {"model." + parts[1], {"model", parts[1]}};
  if (parts.size() == 5 && parts[0] == "optimizer_states" && parts[2] == "state") {
    LOCKSTEP_CHECK(parts[1] == "0", UsageError, "write_dcp_shard: \"", key, "\" is the state of optimizer ", parts[1],
                   "; ", kOneOptimizer);
    const bool decimal = !parts[3].empty() && parts[3].size() < 10 &&
                         parts[3].find_first_not_of("0123456789") == std::string::npos;
    const auto& name = parameter_name(names, decimal ? std::stoll(parts[3]) : -1, key);
    return {"optim.state." + name + "." + parts[4], {"optim", "state", name, parts[4]}};
  }
  throw UsageError("write_dcp_shard: the piece \"" + key + "\" has no DCP name: pieces are \"state_dict/<name>\" "
                   "and \"optimizer_states/0/state/<k>/<name>\".");
}

void write_piece(ShardFile& file, const std::string& key, const TensorPiece& piece,
                 const std::vector<std::string>& names) {
  LOCKSTEP_CHECK(piece.values.defined() && piece.values.dim() == 1, UsageError, "write_dcp_shard: the piece of \"",
                 key, "\" must be a 1-D tensor of its elements. Pass values.flatten() of the elements it holds.");
  const int64_t total = detail::numel_of_shape(piece.shape);
  detail::check_piece_range("write_dcp_shard", key, {piece.begin, piece.values.numel()}, total, piece.shape);
  const auto [fqn, path] = dcp_name_of_piece(key, names);
  const at::Tensor values = piece.values.detach().cpu();
  if (total == 0 && piece.begin == 0) {  // a tensor without elements: one empty chunk says its size
    file.tensor(fqn, path, piece.shape, {std::vector<int64_t>(piece.shape.size(), 0), piece.shape},
                detail::in_own_storage(values.reshape(piece.shape)));
    return;
  }
  for (const auto& box : boxes_of_range(piece.shape, piece.begin, values.numel())) {
    // A box alone, in its own storage: torch.save writes a view's whole storage.
    file.tensor(fqn, path, piece.shape, box.chunk,
                detail::in_own_storage(values.narrow(0, box.start, box.numel).reshape(box.chunk.sizes)));
  }
}

// An entry of optimizer 0's common dict: the scalar state (Adam's step) and the param_groups.
void write_optimizer(ShardFile& file, const c10::impl::GenericDict& optimizer, const std::vector<std::string>& names) {
  for (const auto& entry : optimizer) {
    const auto& what = entry.key().toStringRef();
    if (what == "state") {
      for (const auto& per_parameter : entry.value().toGenericDict()) {
        const auto& name = parameter_name(names, per_parameter.key().toInt(), "optimizer_states/0/state");
        for (const auto& value : per_parameter.value().toGenericDict()) {
          const auto& field = value.key().toStringRef();
          const std::string fqn = "optim.state." + name + "." + field;
          const DcpPath path{"optim", "state", name, field};
          if (!value.value().isTensor()) {
            file.bytes(fqn, path, value.value());
            continue;
          }
          const auto tensor = value.value().toTensor().detach().cpu().contiguous().clone();
          file.tensor(fqn, path, tensor.sizes().vec(), {std::vector<int64_t>(tensor.dim(), 0), tensor.sizes().vec()}, tensor);
        }
      }
    } else if (what == "param_groups") {
      const auto groups = entry.value().toListRef();
      for (size_t g = 0; g < groups.size(); ++g) {
        for (const auto& option : groups[g].toGenericDict()) {
          const auto& field = option.key().toStringRef();
          c10::IValue value = option.value();
          if (field == "params") {
            c10::impl::GenericList fqns(c10::StringType::get());
            for (const auto& k : value.toListRef()) fqns.push_back(parameter_name(names, k.toInt(), "param_groups"));
            value = fqns;
          }
          file.bytes("optim.param_groups." + std::to_string(g) + "." + field, {"optim", "param_groups", int64_t(g), field},
                     value);
        }
      }
    } else {
      throw UsageError("write_dcp_shard: optimizer 0's state holds \"" + what +
                       "\" beside \"state\" and \"param_groups\", which DCP's optimizer state dict has no place for.");
    }
  }
}

void write_common(ShardFile& file, const Checkpoint& common, const std::vector<std::string>& names) {
  for (const auto& entry : common) {
    const auto& name = entry.key().toStringRef();
    if (name != "optimizer_states") {
      file.bytes(name, {name}, entry.value());
      continue;
    }
    const auto optimizers = entry.value().toListRef();
    LOCKSTEP_CHECK(optimizers.size() <= 1, UsageError, "write_dcp_shard: the checkpoint holds ", optimizers.size(),
                   " optimizers; ", kOneOptimizer);
    if (!optimizers.empty()) write_optimizer(file, optimizers[0].toGenericDict(), names);
  }
}

// What commit_dcp_save has gathered from the ranks' indexes, and how its messages end.
struct Commit {
  detail::DcpMetadata metadata;
  std::string caller;
  std::string unchanged;
};

void add_index_item(Commit& commit, int r, const json& entry) {
  const auto fqn = entry.at("fqn").get<std::string>();
  DcpPath path;
  for (const auto& part : entry.at("path")) {
    if (part.is_string()) {
      path.emplace_back(part.get<std::string>());
    } else {
      path.emplace_back(part.get<int64_t>());
    }
  }
  commit.metadata.planner_data[fqn] = path;
  detail::DcpStorage storage{fqn, false, {}, detail::dcp_file_name(r), entry.at("offset").get<int64_t>(),
                             entry.at("length").get<int64_t>()};
  const bool is_new = !commit.metadata.items.count(fqn);
  auto& item = commit.metadata.items[fqn];
  if (!entry.at("tensor").get<bool>()) {
    LOCKSTEP_CHECK(is_new, UsageError, commit.caller, ": \"", fqn, "\" was written twice (rank ", r,
                   " and an earlier one). Only rank 0 writes the common part.", commit.unchanged);
    commit.metadata.storage.push_back(storage);
    return;
  }
  at::ScalarType dtype = at::kFloat;
  detail::parse_dtype(entry.at("dtype").get<std::string>(), dtype);
  const auto size = entry.at("size").get<std::vector<int64_t>>();
  if (is_new) {
    item.is_tensor = true;
    item.dtype = dtype;
    item.size = size;
  }
  LOCKSTEP_CHECK(item.is_tensor && item.dtype == dtype && item.size == size, UsageError, commit.caller,
                 ": the chunks of \"", fqn, "\" disagree: rank ", r, " gives ", detail::shape_text(size), " ",
                 detail::dtype_name(dtype), ". Every rank must describe the same full tensor.", commit.unchanged);
  item.chunks.push_back({entry.at("offsets").get<std::vector<int64_t>>(), entry.at("sizes").get<std::vector<int64_t>>()});
  storage.has_offsets = true;
  storage.chunk_offsets = item.chunks.back().offsets;
  commit.metadata.storage.push_back(storage);
}

void add_rank_index(Commit& commit, const fs::path& tmp, int r, int world_size) {
  const fs::path index_path = tmp / detail::rank_index_name(r);
  LOCKSTEP_CHECK(fs::exists(index_path) && fs::exists(tmp / detail::dcp_file_name(r)), UsageError, commit.caller,
                 ": rank ", r, "'s shard is not in '", tmp.string(), "'. Every rank calls write_dcp_shard(tmp_dir, rank, ",
                 world_size, ", ...), and rank 0 commits after a barrier that all of them have passed.",
                 commit.unchanged);
  try {
    const json index = json::parse(detail::read_text_file(index_path));
    LOCKSTEP_CHECK(index.at("world_size").get<int>() == world_size && index.at("rank").get<int>() == r, UsageError,
                   commit.caller, ": '", index_path.string(), "' was written by another rank or world size. Pass "
                   "every rank the same world_size.", commit.unchanged);
    for (const auto& entry : index.at("items")) add_index_item(commit, r, entry);
  } catch (const json::exception& e) {
    throw UsageError(commit.caller + ": '" + index_path.string() + "' is damaged (" + e.what() +
                     "). Save again: begin_sharded_save clears the temporary directory." + commit.unchanged);
  }
}

// UsageError unless the chunks of each tensor (contiguous runs of its flat order, as
// write_dcp_shard cuts them) cover it exactly once.
void check_chunks(const Commit& commit) {
  for (const auto& [fqn, item] : commit.metadata.items) {
    if (!item.is_tensor) continue;
    std::vector<std::pair<int64_t, int64_t>> runs;  // [first, end) in the flat order
    for (const auto& chunk : item.chunks) {
      int64_t first = 0, numel = 1;
      for (size_t d = 0; d < chunk.offsets.size(); ++d) {
        first += chunk.offsets[d] * inner_numel(item.size, d);
        numel *= chunk.sizes[d];
      }
      runs.emplace_back(first, first + numel);
    }
    std::sort(runs.begin(), runs.end());
    int64_t end = 0;
    for (const auto& run : runs) {
      LOCKSTEP_CHECK(run.first == end || run.first == run.second, UsageError, commit.caller, ": the chunks of \"", fqn,
                     "\" (shape ", detail::shape_text(item.size), ") do not cover it exactly once: elements ",
                     detail::range_text(std::min(end, run.first), std::abs(run.first - end)),
                     run.first > end ? " are in no rank's piece" : " are in two", ".", commit.unchanged);
      end = std::max(end, run.second);
    }
    LOCKSTEP_CHECK(end == detail::numel_of_shape(item.size), UsageError, commit.caller, ": the chunks of \"", fqn,
                   "\" end at element ", end, " of ", detail::numel_of_shape(item.size), ".", commit.unchanged);
  }
}

}  // namespace

void commit_dcp_save(const std::string& tmp_dir, const std::string& final_dir, int world_size) {
  const fs::path tmp(tmp_dir);
  const fs::path dir = detail::checkpoint_directory(final_dir, "commit_dcp_save");
  Commit commit;
  commit.caller = "commit_dcp_save('" + dir.string() + "')";
  commit.unchanged = " The checkpoint at '" + dir.string() + "' (if any) is unchanged.";
  LOCKSTEP_CHECK(world_size >= 1, UsageError, commit.caller, ": world_size is ", world_size, "; pass the process group's.");
  for (int r = 0; r < world_size; ++r) add_rank_index(commit, tmp, r, world_size);
  check_chunks(commit);
  commit.metadata.version = kDcpVersion;
  detail::write_text_atomically(tmp / detail::kDcpMetadata, detail::write_dcp_metadata(commit.metadata));
  std::error_code error;
  for (int r = 0; r < world_size; ++r) fs::remove(tmp / detail::rank_index_name(r), error);
  detail::move_into_place(tmp, dir);
}

void write_dcp_shard(const std::string& tmp_dir, int rank, int world_size, const ShardedCheckpoint& shard,
                     const std::vector<std::string>& parameter_names) {
  LOCKSTEP_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, UsageError, "write_dcp_shard('", tmp_dir,
                 "'): rank ", rank, " is not in [0, world_size=", world_size,
                 "). Pass the process group's rank and world size.");
  const fs::path dir(tmp_dir);
  json index = json::array();
  detail::write_atomically((dir / detail::dcp_file_name(rank)).string(), "saving DCP checkpoint",
                           [&](const detail::WriteBytes& write) {
                             ShardFile file(write, index);
                             for (const auto& [key, piece] : shard.pieces) write_piece(file, key, piece, parameter_names);
                             if (rank == 0) write_common(file, shard.common, parameter_names);
                           });
  // After the data file: commit_dcp_save takes an index as the sign that its file is complete.
  const json rank_index = {{"rank", rank}, {"world_size", world_size}, {"items", index}};
  detail::write_text_atomically(dir / detail::rank_index_name(rank), rank_index.dump());
}

}  // namespace checkpoint
}  // namespace lockstep
