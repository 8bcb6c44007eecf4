#include "sharded_format.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <utility>

#include <c10/util/ArrayRef.h>
#include <c10/util/StringUtil.h>

#include <lockstep/core/error.h>

namespace lockstep {
namespace checkpoint {
namespace detail {

namespace fs = std::filesystem;

std::string rank_file_name(int rank) { return "rank_" + std::to_string(rank) + ".ckpt"; }

std::string rank_index_name(int rank) { return "rank_" + std::to_string(rank) + ".json"; }

std::string dcp_file_name(int rank) { return "__" + std::to_string(rank) + "_0.distcp"; }

fs::path checkpoint_directory(const std::string& dir, const std::string& caller) {
  LOCKSTEP_CHECK(!dir.empty(), UsageError, caller,
                 ": the checkpoint directory is empty. Pass a path such as \"checkpoints/step=100\".");
  fs::path path = fs::path(dir).lexically_normal();
  if (!path.has_filename() && path.has_parent_path()) path = path.parent_path();
  return path;
}

fs::path sibling_path(const fs::path& path, const std::string& suffix) { return fs::path(path.string() + suffix); }

std::string read_text_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

int64_t numel_of_shape(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (const int64_t size : shape) n *= size;
  return n;
}

std::string shape_text(const std::vector<int64_t>& shape) { return c10::str(c10::IntArrayRef(shape)); }

std::string range_text(int64_t begin, int64_t numel) {
  return "[" + std::to_string(begin) + ", " + std::to_string(begin + numel) + ")";
}

std::string dtype_name(c10::ScalarType dtype) { return c10::toString(dtype); }

bool parse_dtype(const std::string& name, c10::ScalarType& dtype) {
  for (int i = 0; i < static_cast<int>(c10::ScalarType::NumOptions); ++i) {
    const auto type = static_cast<c10::ScalarType>(i);
    if (name == c10::toString(type)) {
      dtype = type;
      return true;
    }
  }
  return false;
}

std::string coverage_problem(const std::vector<PieceRange>& ranks, int64_t total) {
  std::vector<std::pair<PieceRange, int>> pieces;
  for (int r = 0; r < static_cast<int>(ranks.size()); ++r) {
    const PieceRange& range = ranks[r];
    if (range.begin < 0 || range.numel < 0) {
      return "rank " + std::to_string(r) + " has the invalid range begin=" + std::to_string(range.begin) +
             " numel=" + std::to_string(range.numel);
    }
    if (range.numel > 0) pieces.emplace_back(range, r);
  }
  std::sort(pieces.begin(), pieces.end(), [](const auto& a, const auto& b) { return a.first.begin < b.first.begin; });
  int64_t next = 0;
  int previous = -1;
  for (const auto& [range, r] : pieces) {
    if (range.begin < next) {
      return "rank " + std::to_string(r) + "'s elements " + range_text(range.begin, range.numel) + " overlap rank " +
             std::to_string(previous) + "'s, which end at " + std::to_string(next);
    }
    if (range.begin > next) return "elements " + range_text(next, range.begin - next) + " are in no rank's piece";
    next = range.begin + range.numel;
    previous = r;
  }
  if (next < total) return "elements " + range_text(next, total - next) + " are in no rank's piece";
  if (next > total) {
    return "rank " + std::to_string(previous) + "'s piece ends at element " + std::to_string(next) +
           ", past the tensor's " + std::to_string(total);
  }
  return "";
}

void check_piece_range(const std::string& caller, const std::string& key, const PieceRange& range, int64_t total,
                       const std::vector<int64_t>& shape) {
  if (range.begin < 0 || range.numel < 0 || range.begin + range.numel > total) {
    throw UsageError(caller + ": the range " + range_text(range.begin, range.numel) + " of \"" + key +
                     "\" lies outside its " + std::to_string(total) + " elements (shape " + shape_text(shape) +
                     "). Ask for ranges within [0, " + std::to_string(total) + ").");
  }
}

std::vector<std::string> split_piece_key(const std::string& key, const std::string& caller) {
  std::vector<std::string> names;
  std::size_t start = 0;
  while (true) {
    const std::size_t slash = key.find('/', start);
    names.push_back(key.substr(start, slash == std::string::npos ? std::string::npos : slash - start));
    if (names.back().empty()) {
      throw UsageError(caller + ": the piece key \"" + key +
                       "\" has an empty name in it. Keys are paths of "
                       "non-empty names joined by '/', such as \"state_dict/fc1.weight\".");
    }
    if (slash == std::string::npos) return names;
    start = slash + 1;
  }
}

}  // namespace detail
}  // namespace checkpoint
}  // namespace lockstep
