#pragma once
// What the writing and the reading of sharded checkpoints share: file names, the coverage check,
// dtype names and message pieces (see include/lockstep/checkpoint/sharded_checkpoint.h).

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <c10/core/ScalarType.h>

#include <lockstep/checkpoint/sharded_checkpoint.h>

namespace lockstep {
namespace checkpoint {
namespace detail {

inline constexpr const char* kShardedFormat = "lockstep sharded checkpoint";
inline constexpr int kShardedVersion = 1;
inline constexpr const char* kShardedMetadata = "metadata.json";

/// A DCP checkpoint's metadata file (torch.distributed.checkpoint.filesystem's _metadata_fn).
inline constexpr const char* kDcpMetadata = ".metadata";
/// "__3_0.distcp": a rank's data file in a DCP checkpoint, as FileSystemWriter names its first.
std::string dcp_file_name(int rank);

/// "rank_3.ckpt": a rank's file in a sharded checkpoint.
std::string rank_file_name(int rank);
/// "rank_3.json": a rank's piece index, in the temporary directory of a save only.
std::string rank_index_name(int rank);

/// `dir` without a trailing separator, so that "<dir>.tmp" is a sibling, not a child; UsageError
/// naming `caller` for an empty path.
std::filesystem::path checkpoint_directory(const std::string& dir, const std::string& caller);
/// "<path><suffix>".
std::filesystem::path sibling_path(const std::filesystem::path& path, const std::string& suffix);

/// The whole file as text ("" when it cannot be read).
std::string read_text_file(const std::filesystem::path& path);

int64_t numel_of_shape(const std::vector<int64_t>& shape);
/// "[4, 6]"
std::string shape_text(const std::vector<int64_t>& shape);
/// "[begin, begin + numel)"
std::string range_text(int64_t begin, int64_t numel);
/// "Float", "BFloat16": LibTorch's name of a dtype, as metadata.json stores it.
std::string dtype_name(c10::ScalarType dtype);
/// The dtype dtype_name() names `name`; false for none.
bool parse_dtype(const std::string& name, c10::ScalarType& dtype);

/// "" when the non-empty ranges (one per rank) cover [0, total) exactly once; otherwise what is
/// wrong, naming the ranks ("rank 1's elements [4, 10) overlap rank 0's, which end at 6").
std::string coverage_problem(const std::vector<PieceRange>& ranks, int64_t total);

/// UsageError naming `caller`, `key` and the tensor's size unless `range` lies within [0, total).
void check_piece_range(const std::string& caller, const std::string& key, const PieceRange& range, int64_t total,
                       const std::vector<int64_t>& shape);

/// Writes `text` to a new temporary file beside `path`, fsyncs it and renames it over `path`;
/// IoError naming the path.
void write_text_atomically(const std::filesystem::path& path, const std::string& text);

/// Moves the complete directory `tmp` to `final_dir` (commit_sharded_save's last step): one
/// rename, or an atomic exchange with the checkpoint already there; IoError naming the path.
void move_into_place(const std::filesystem::path& tmp, const std::filesystem::path& final_dir);

/// The '/'-separated names of a piece key ("optimizer_states/0/state/3/exp_avg"); UsageError,
/// naming `caller`, for an empty key or an empty name in it ("a//b", "/a").
std::vector<std::string> split_piece_key(const std::string& key, const std::string& caller);

}  // namespace detail
}  // namespace checkpoint
}  // namespace lockstep
