// Writing a sharded checkpoint: begin_sharded_save, write_shard, commit_sharded_save.

#include <lockstep/checkpoint/sharded_checkpoint.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <map>
#include <system_error>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <lockstep/core/error.h>

#include "sharded_format.h"
#include "torch_file.h"

namespace lockstep {
namespace checkpoint {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Dict = c10::impl::GenericDict;

void sync_folder(const fs::path& dir) {
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);  // Some filesystems refuse fsync on a directory; the rename has happened either way.
  ::close(fd);
}

fs::path parent_folder(const fs::path& path) { return path.has_parent_path() ? path.parent_path() : fs::path("."); }

std::error_code last_error() { return std::error_code(errno, std::generic_category()); }

[[noreturn]] void fail_sharded_io(const std::string& action, const fs::path& path, std::error_code error) {
  throw IoError(action, path.string(), error,
                "The checkpoint under the final name (if any) is unchanged. Check that the folder is writable and "
                "that the disk has free space.");
}

json metadata_json(const ShardedMetadata& metadata) {
  json tensors = json::object();
  for (const auto& [key, info] : metadata.tensors) {
    json ranks = json::array();
    for (const auto& range : info.ranks) ranks.push_back({{"begin", range.begin}, {"numel", range.numel}});
    tensors[key] = {{"shape", info.shape}, {"dtype", detail::dtype_name(info.dtype)}, {"ranks", ranks}};
  }
  return {{"format", detail::kShardedFormat},
          {"version", metadata.version},
          {"world_size", metadata.world_size},
          {"tensors", tensors}};
}

// What commit_sharded_save checks the ranks' indexes against, and how its messages start and end.
struct ShardCheck {
  const fs::path& tmp;
  int world_size;
  const std::string& caller;
  const std::string& unchanged;
};

// Adds the pieces that rank `r`'s index lists to `metadata`, marking in `listed` (by key) the ranks
// that have a piece; UsageError for a missing or damaged index, one of another rank or world size,
// and a piece whose shape or dtype disagrees with an earlier rank's.
void add_rank_index(const ShardCheck& check, int r, ShardedMetadata& metadata,
                    std::map<std::string, std::vector<bool>>& listed) {
  const auto& [tmp, world_size, caller, unchanged] = check;
  const fs::path index_path = tmp / detail::rank_index_name(r);
  if (!fs::exists(index_path) || !fs::exists(tmp / detail::rank_file_name(r))) {
    throw UsageError(caller + ": rank " + std::to_string(r) + "'s shard is not in '" + tmp.string() +
                     "'. Every rank calls write_shard(tmp_dir, rank, " + std::to_string(world_size) +
                     ", shard), and rank 0 commits after a barrier that all of them have passed." + unchanged);
  }
  try {
    const json index = json::parse(detail::read_text_file(index_path));
    if (index.at("world_size").get<int>() != world_size || index.at("rank").get<int>() != r) {
      throw UsageError(caller + ": '" + index_path.string() + "' was written by rank " +
                       std::to_string(index.at("rank").get<int>()) + " of world_size " +
                       std::to_string(index.at("world_size").get<int>()) + ", not rank " + std::to_string(r) +
                       " of " + std::to_string(world_size) + ". Pass every rank the same world_size." + unchanged);
    }
    for (const auto& item : index.at("pieces").items()) {
      const json& entry = item.value();
      const auto shape = entry.at("shape").get<std::vector<int64_t>>();
      at::ScalarType dtype = at::kFloat;
      detail::parse_dtype(entry.at("dtype").get<std::string>(), dtype);
      auto& info = metadata.tensors[item.key()];
      if (info.ranks.empty()) {
        info.shape = shape;
        info.dtype = dtype;
        info.ranks.resize(world_size);
      } else if (info.shape != shape || info.dtype != dtype) {
        throw UsageError(caller + ": the pieces of \"" + item.key() + "\" disagree: rank " + std::to_string(r) +
                         " gives " + detail::shape_text(shape) + " " + detail::dtype_name(dtype) +
                         ", an earlier rank " + detail::shape_text(info.shape) + " " + detail::dtype_name(info.dtype) +
                         ". Every rank must describe the same full tensor." + unchanged);
      }
      info.ranks[r] = {entry.at("begin").get<int64_t>(), entry.at("numel").get<int64_t>()};
      listed[item.key()].resize(world_size);
      listed[item.key()][r] = true;
    }
  } catch (const json::exception& e) {
    throw UsageError(caller + ": '" + index_path.string() + "' is damaged (" + e.what() +
                     "). Save again: begin_sharded_save clears the temporary directory." + unchanged);
  }
}

// UsageError naming the key when a rank has no piece of it, or its pieces do not cover it
// exactly once.
void check_coverage(const ShardCheck& check, const ShardedMetadata& metadata,
                    std::map<std::string, std::vector<bool>>& listed) {
  for (const auto& [key, info] : metadata.tensors) {
    const auto& ranks = listed[key];
    const auto without = std::find(ranks.begin(), ranks.end(), false);
    if (without != ranks.end()) {
      throw UsageError(check.caller + ": rank " + std::to_string(without - ranks.begin()) + " has no piece of \"" +
                       key + "\", which rank " +
                       std::to_string(std::find(ranks.begin(), ranks.end(), true) - ranks.begin()) +
                       " has. Every rank lists every key, with an empty piece (values of 0 elements) where it holds "
                       "none of the tensor, so that none goes missing." +
                       check.unchanged);
    }
    const std::string problem = detail::coverage_problem(info.ranks, detail::numel_of_shape(info.shape));
    if (!problem.empty()) {
      throw UsageError(check.caller + ": the pieces of \"" + key + "\" (shape " + detail::shape_text(info.shape) +
                       ") do not cover it exactly once: " + problem +
                       ". Each element must be in exactly one rank's piece." + check.unchanged);
    }
  }
}

// The metadata of the shards that every rank's index in `tmp` describes; UsageError naming the
// rank or the key for a missing shard, pieces that disagree, a key a rank has no piece of, and
// pieces that do not cover their tensor exactly once.
ShardedMetadata metadata_of_shards(const fs::path& tmp, int world_size, const std::string& caller,
                                   const std::string& unchanged) {
  const ShardCheck check{tmp, world_size, caller, unchanged};
  ShardedMetadata metadata;
  metadata.world_size = world_size;
  std::map<std::string, std::vector<bool>> listed;  // by key, which ranks have a piece of it
  for (int r = 0; r < world_size; ++r) add_rank_index(check, r, metadata, listed);
  check_coverage(check, metadata, listed);
  return metadata;
}

}  // namespace

namespace detail {

// Writes `text` to a new temporary file beside `path`, fsyncs it and renames it over `path`.
void write_text_atomically(const fs::path& path, const std::string& text) {
  std::string temp = path.string() + ".tmp.XXXXXX";
  const int fd = ::mkostemp(temp.data(), O_CLOEXEC);
  if (fd < 0) fail_sharded_io("creating a temporary file for", path, last_error());
  const char* data = text.data();
  std::size_t left = text.size();
  int error = 0;
  while (left > 0 && error == 0) {
    const ssize_t n = ::write(fd, data, left);
    if (n < 0 && errno != EINTR) error = errno;
    if (n > 0) data += n, left -= static_cast<std::size_t>(n);
  }
  if (error == 0 && ::fchmod(fd, 0644) != 0) error = errno;
  if (error == 0 && ::fsync(fd) != 0) error = errno;
  if (::close(fd) != 0 && error == 0) error = errno;
  if (error == 0 && ::rename(temp.c_str(), path.c_str()) != 0) error = errno;
  if (error != 0) {
    ::unlink(temp.c_str());
    fail_sharded_io("writing", path, std::error_code(error, std::generic_category()));
  }
  sync_folder(parent_folder(path));
}

// Moves the complete directory `tmp` to `final_dir`: one rename when nothing is there, else an
// atomic exchange; where the filesystem has none, the old one goes to "<final>.old" first (and
// begin_sharded_save puts it back if the process dies between the two renames).
void move_into_place(const fs::path& tmp, const fs::path& final_dir) {
  const fs::path parent = parent_folder(final_dir);
  std::error_code error;
  if (!fs::exists(fs::symlink_status(final_dir, error))) {
    if (::rename(tmp.c_str(), final_dir.c_str()) != 0) {
      fail_sharded_io("renaming '" + tmp.string() + "' to", final_dir, last_error());
    }
    sync_folder(parent);
    return;
  }
#ifdef RENAME_EXCHANGE
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0) {
    sync_folder(parent);
    fs::remove_all(tmp, error);  // the previous checkpoint; a leftover is removed by the next save
    return;
  }
  if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) {
    fail_sharded_io("exchanging '" + tmp.string() + "' with", final_dir, last_error());
  }
#endif
  const fs::path old = detail::sibling_path(final_dir, ".old");
  fs::remove_all(old, error);
  if (error) fail_sharded_io("removing", old, error);
  if (::rename(final_dir.c_str(), old.c_str()) != 0) fail_sharded_io("moving aside", final_dir, last_error());
  if (::rename(tmp.c_str(), final_dir.c_str()) != 0) {
    const std::error_code reason = last_error();
    ::rename(old.c_str(), final_dir.c_str());
    fail_sharded_io("renaming '" + tmp.string() + "' to", final_dir, reason);
  }
  sync_folder(parent);
  fs::remove_all(old, error);
}

}  // namespace detail

std::string begin_sharded_save(const std::string& final_dir, int rank) {
  const fs::path dir = detail::checkpoint_directory(final_dir, "begin_sharded_save");
  const fs::path tmp = detail::sibling_path(dir, ".tmp");
  if (rank != 0) return tmp.string();
  std::error_code error;
  const fs::path old = detail::sibling_path(dir, ".old");
  if (fs::exists(old, error)) {
    if (!fs::exists(fs::symlink_status(dir, error))) {
      // A commit died between moving the previous checkpoint aside and renaming the new one in.
      if (::rename(old.c_str(), dir.c_str()) != 0) {
        fail_sharded_io("restoring '" + old.string() + "' to", dir, last_error());
      }
    } else {
      fs::remove_all(old, error);
      if (error) fail_sharded_io("removing", old, error);
    }
  }
  fs::remove_all(tmp, error);
  if (error) fail_sharded_io("removing what an interrupted save left in", tmp, error);
  fs::create_directories(tmp, error);
  if (error) fail_sharded_io("creating", tmp, error);
  sync_folder(parent_folder(dir));
  return tmp.string();
}

void write_shard(const std::string& tmp_dir, int rank, int world_size, const ShardedCheckpoint& shard) {
  LOCKSTEP_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, UsageError, "write_shard('", tmp_dir, "'): rank ",
                 rank, " is not in [0, world_size=", world_size, "). Pass the process group's rank and world size.");
  Dict pieces(c10::StringType::get(), c10::AnyType::get());
  json index = json::object();
  for (const auto& [key, piece] : shard.pieces) {
    detail::split_piece_key(key, "write_shard");
    const std::string where = "write_shard: the piece of \"" + key + "\"";
    LOCKSTEP_CHECK(piece.values.defined() && piece.values.dim() == 1, UsageError, where,
                   " must be a 1-D tensor of its elements; got ",
                   piece.values.defined() ? "shape " + c10::str(piece.values.sizes()) : std::string("none"),
                   ". Pass values.flatten() of the elements it holds.");
    LOCKSTEP_CHECK(std::all_of(piece.shape.begin(), piece.shape.end(), [](int64_t s) { return s >= 0; }), UsageError,
                   where, " has the shape ", detail::shape_text(piece.shape), ". Give the full tensor's shape.");
    detail::check_piece_range("write_shard", key, {piece.begin, piece.values.numel()},
                              detail::numel_of_shape(piece.shape), piece.shape);
    // torch.save writes a tensor's whole storage: a slice of a flat buffer is saved alone.
    const at::Tensor values = detail::in_own_storage(piece.values.detach().cpu());
    Dict entry(c10::StringType::get(), c10::AnyType::get());
    entry.insert("shape", piece.shape);
    entry.insert("begin", piece.begin);
    entry.insert("values", values);
    pieces.insert(key, entry);
    index[key] = {{"shape", piece.shape},
                  {"dtype", detail::dtype_name(values.scalar_type())},
                  {"begin", piece.begin},
                  {"numel", values.numel()}};
  }
  Checkpoint file = make_checkpoint();
  file.insert("format", std::string(detail::kShardedFormat));
  file.insert("version", int64_t{detail::kShardedVersion});
  file.insert("rank", int64_t{rank});
  file.insert("world_size", int64_t{world_size});
  file.insert("common", rank == 0 ? shard.common : make_checkpoint());
  file.insert("pieces", pieces);
  const fs::path dir(tmp_dir);
  CheckpointIO().save(file, (dir / detail::rank_file_name(rank)).string());
  // After the rank file: commit_sharded_save takes an index as the sign that its file is complete.
  const json rank_index = {{"rank", rank}, {"world_size", world_size}, {"pieces", index}};
  detail::write_text_atomically(dir / detail::rank_index_name(rank), rank_index.dump());
}

void commit_sharded_save(const std::string& tmp_dir, const std::string& final_dir, int world_size) {
  const fs::path tmp(tmp_dir);
  const fs::path dir = detail::checkpoint_directory(final_dir, "commit_sharded_save");
  const std::string caller = "commit_sharded_save('" + dir.string() + "')";
  LOCKSTEP_CHECK(world_size >= 1, UsageError, caller, ": world_size is ", world_size, "; pass the process group's.");
  const ShardedMetadata metadata =
      metadata_of_shards(tmp, world_size, caller, " The checkpoint at '" + dir.string() + "' (if any) is unchanged.");
  detail::write_text_atomically(tmp / detail::kShardedMetadata, metadata_json(metadata).dump(1));
  std::error_code error;
  for (int r = 0; r < world_size; ++r) fs::remove(tmp / detail::rank_index_name(r), error);
  sync_folder(tmp);
  detail::move_into_place(tmp, dir);
}

}  // namespace checkpoint
}  // namespace lockstep
