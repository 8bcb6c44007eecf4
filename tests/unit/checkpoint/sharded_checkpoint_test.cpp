#include <lockstep/checkpoint/sharded_checkpoint.h>
#include <lockstep/checkpoint/optimizer_state.h>
#include <lockstep/checkpoint/state_dict.h>
#include <lockstep/core/error.h>

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "../../support/command.h"
#include "../../support/errors.h"
#include "../../support/paths.h"
#include "../../support/temp_dir.h"

namespace lockstep {
namespace checkpoint {
namespace sharded_checkpoint_test {
namespace {

namespace fs = std::filesystem;
using testing::error_of;
using testing::TempDir;
using Tensors = std::map<std::string, at::Tensor>;
/// Each rank's ranges, by key.
using Layout = std::vector<std::map<std::string, PieceRange>>;

// Tensors of several shapes and dtypes, a 0-dim one and one without elements among them.
Tensors sample_tensors() {
  torch::manual_seed(7);
  return {{"state_dict/fc.weight", torch::randn({4, 6})},
          {"state_dict/fc.bias", torch::randn({4})},
          {"state_dict/bn.num_batches_tracked", torch::tensor(int64_t{41})},
          {"state_dict/empty", torch::randn({3, 0})},
          {"optimizer_states/0/state/0/exp_avg", torch::randn({4, 6}, torch::kFloat64)},
          {"optimizer_states/0/state/1/exp_avg", torch::randn({5, 3}).to(torch::kBFloat16)}};
}

// Each tensor split alone into `world` near-equal pieces (the last ranks' may be empty).
Layout even_layout(const Tensors& tensors, int world) {
  Layout layout(world);
  for (const auto& [key, tensor] : tensors) {
    const int64_t n = tensor.numel(), chunk = (n + world - 1) / world;
    for (int r = 0; r < world; ++r) {
      const int64_t begin = std::min(r * chunk, n), end = std::min((r + 1) * chunk, n);
      layout[r][key] = {begin, end - begin};
    }
  }
  return layout;
}

// All tensors in key order in one flat buffer split into `world` equal shards (FlatLayout's
// way): most ranks hold elements of only some tensors, and empty pieces of the others.
Layout flat_layout(const Tensors& tensors, int world) {
  int64_t total = 0;
  for (const auto& entry : tensors) total += entry.second.numel();
  const int64_t shard = (total + world - 1) / world;
  Layout layout(world);
  int64_t offset = 0;
  for (const auto& [key, tensor] : tensors) {
    for (int r = 0; r < world; ++r) {
      const int64_t lo = std::max(offset, r * shard), hi = std::min(offset + tensor.numel(), (r + 1) * shard);
      layout[r][key] = lo < hi ? PieceRange{lo - offset, hi - lo} : PieceRange{0, 0};
    }
    offset += tensor.numel();
  }
  return layout;
}

Checkpoint sample_common(int64_t epoch) {
  auto common = make_checkpoint();
  common.insert("epoch", epoch);
  common.insert("global_step", int64_t{1000} + epoch);
  return common;
}

// One simulated job: every rank's begin, write and commit, in the order the barriers allow.
void save(const std::string& dir, const Tensors& tensors, const Layout& layout, const Checkpoint& common) {
  const int world = static_cast<int>(layout.size());
  const std::string tmp = begin_sharded_save(dir, 0);
  for (int r = 1; r < world; ++r) ASSERT_EQ(begin_sharded_save(dir, r), tmp);
  for (int r = 0; r < world; ++r) {
    ShardedCheckpoint shard;
    shard.common = r == 0 ? common : sample_common(-1);  // only rank 0's is kept
    shard.pieces = cut_pieces(tensors, layout[r]);
    write_shard(tmp, r, world, shard);
  }
  commit_sharded_save(tmp, dir, world);
}

// Same dtype, shape and bytes.
void expect_same_bits(const at::Tensor& expected, const at::Tensor& actual, const std::string& where) {
  ASSERT_TRUE(actual.defined()) << where;
  ASSERT_EQ(expected.scalar_type(), actual.scalar_type()) << where;
  ASSERT_EQ(expected.sizes(), actual.sizes()) << where;
  const auto a = expected.contiguous(), b = actual.contiguous();
  EXPECT_EQ(std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()), 0) << where << ": " << a << " vs " << b;
}

void expect_full(const ReassembledCheckpoint& loaded, const Tensors& tensors, int64_t epoch) {
  EXPECT_EQ(loaded.common.at("epoch").toInt(), epoch);
  ASSERT_EQ(loaded.tensors.size(), tensors.size());
  for (const auto& [key, tensor] : tensors) expect_same_bits(tensor, loaded.tensors.at(key), key);
}

std::vector<std::string> names_in(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_text(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::trunc) << text; }

void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  const std::string message = error_of(fn);
  for (const auto& part : parts)
    EXPECT_NE(message.find(part), std::string::npos) << "\"" << part << "\" not in: " << message;
}

TEST(ShardedCheckpointTest, TwoRanksSaveAndLoadTheFullTensorsBitExact) {
  TempDir root{"lockstep_sharded"};
  const std::string dir = root / "step=10";
  const auto tensors = sample_tensors();
  save(dir, tensors, even_layout(tensors, 2), sample_common(3));

  EXPECT_EQ(names_in(root.path()), std::vector<std::string>{"step=10"}) << "the temporary directory is gone";
  EXPECT_EQ(names_in(dir), (std::vector<std::string>{"metadata.json", "rank_0.ckpt", "rank_1.ckpt"}));
  EXPECT_TRUE(is_sharded_checkpoint(dir));
  EXPECT_FALSE(is_sharded_checkpoint(dir + "/rank_0.ckpt"));
  expect_full(load_sharded(dir), tensors, 3);
  EXPECT_EQ(load_sharded(dir).common.at("global_step").toInt(), 1003) << "rank 0's common dict";

  const auto metadata = nlohmann::json::parse(read_text(dir + "/metadata.json"));
  EXPECT_EQ(metadata["world_size"], 2);
  EXPECT_EQ(metadata["version"], 1);
  const auto& weight = metadata["tensors"]["state_dict/fc.weight"];
  EXPECT_EQ(weight["shape"], nlohmann::json({4, 6}));
  EXPECT_EQ(weight["dtype"], "Float");
  EXPECT_EQ(weight["ranks"], nlohmann::json::parse(R"([{"begin":0,"numel":12},{"begin":12,"numel":12}])"));
  EXPECT_EQ(metadata["tensors"]["optimizer_states/0/state/1/exp_avg"]["dtype"], "BFloat16");
  const auto info = read_sharded_metadata(dir);
  EXPECT_EQ(info.world_size, 2);
  EXPECT_EQ(info.tensors.at("state_dict/bn.num_batches_tracked").shape, std::vector<int64_t>{});
  EXPECT_EQ(info.tensors.at("state_dict/bn.num_batches_tracked").dtype, at::kLong);
}

TEST(ShardedCheckpointTest, ASecondSaveReplacesTheFirstOnlyWhenComplete) {
  TempDir root{"lockstep_sharded"};
  const std::string dir = root / "last";
  const auto first = sample_tensors();
  save(dir, first, even_layout(first, 2), sample_common(1));
  Tensors second;
  for (const auto& [key, tensor] : first) second[key] = tensor + 1;
  save(dir, second, flat_layout(second, 3), sample_common(2));  // another world size under the same name
  expect_full(load_sharded(dir), second, 2);
  EXPECT_EQ(names_in(root.path()), std::vector<std::string>{"last"});
  EXPECT_EQ(read_sharded_metadata(dir).world_size, 3);
}

struct Reshard {
  int from;
  int to;
};

class ShardedReshardTest : public ::testing::TestWithParam<Reshard> {};

// Saved in one layout, read back in another: each new rank's pieces equal the cut of the full tensors.
TEST_P(ShardedReshardTest, PiecesOfTheNewLayoutAreBitExact) {
  const auto [from, to] = GetParam();
  TempDir root{"lockstep_sharded"};
  const auto tensors = sample_tensors();
  for (const bool flat_first : {true, false}) {
    const std::string dir = root / (flat_first ? "flat" : "even");
    save(dir, tensors, flat_first ? flat_layout(tensors, from) : even_layout(tensors, from), sample_common(5));
    const Layout wanted = flat_first ? even_layout(tensors, to) : flat_layout(tensors, to);
    for (int r = 0; r < to; ++r) {
      const ShardedCheckpoint mine = load_sharded_pieces(dir, wanted[r]);
      EXPECT_EQ(mine.common.at("epoch").toInt(), 5);
      const auto expected = cut_pieces(tensors, wanted[r]);
      ASSERT_EQ(mine.pieces.size(), expected.size()) << "rank " << r;
      for (const auto& [key, piece] : expected) {
        const std::string where = dir + " rank " + std::to_string(r) + " " + key;
        const TensorPiece& got = mine.pieces.at(key);
        EXPECT_EQ(got.shape, piece.shape) << where;
        EXPECT_EQ(got.begin, piece.begin) << where;
        expect_same_bits(piece.values, got.values, where);
        expect_same_bits(tensors.at(key).reshape({-1}).narrow(0, piece.begin, piece.values.numel()), got.values, where);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ShardedReshardTest,
                         ::testing::Values(Reshard{2, 4}, Reshard{4, 3}, Reshard{3, 2}, Reshard{2, 2}, Reshard{1, 5}),
                         [](const auto& info) {
                           return std::to_string(info.param.from) + "to" + std::to_string(info.param.to);
                         });

TEST(ShardedCheckpointTest, EmptyPiecesAreFineAndAKeyARankLeavesOutIsRefused) {
  TempDir root{"lockstep_sharded"};
  const std::string dir = root / "ckpt";
  const auto tensors = sample_tensors();
  // 5 ranks over 93 elements in one flat buffer: every rank holds empty pieces of most keys, and
  // the tensor without elements only empty ones.
  Layout layout = flat_layout(tensors, 5);
  EXPECT_EQ(layout[4].at("state_dict/fc.bias").numel, 0);
  save(dir, tensors, layout, sample_common(0));
  expect_full(load_sharded(dir), tensors, 0);
  EXPECT_EQ(load_sharded(dir).tensors.at("state_dict/empty").sizes(), (std::vector<int64_t>{3, 0}));
  const auto none = load_sharded_pieces(dir, {{"state_dict/fc.bias", {4, 0}}, {"state_dict/empty", {0, 0}}});
  EXPECT_EQ(none.pieces.at("state_dict/fc.bias").values.numel(), 0);
  EXPECT_EQ(none.pieces.at("state_dict/fc.bias").values.scalar_type(), at::kFloat);
  EXPECT_EQ(none.pieces.at("state_dict/empty").shape, (std::vector<int64_t>{3, 0}));

  layout[3].erase("state_dict/empty");
  expect_error([&] { save(dir, tensors, layout, sample_common(1)); },
               {"rank 3 has no piece of \"state_dict/empty\", which rank 0 has", "empty piece"});
  expect_full(load_sharded(dir), tensors, 0);
}

TEST(ShardedCheckpointTest, APieceThatIsAViewIsSavedWithoutItsBuffer) {
  TempDir root{"lockstep_sharded"};
  const auto buffer = torch::arange(1000000, torch::kFloat32);  // 4 MB, as a rank's flat shard
  const std::string tmp = begin_sharded_save(root / "ckpt", 0);
  ShardedCheckpoint shard;
  shard.pieces["state_dict/w"] = {{5}, 0, buffer.narrow(0, 10, 5)};
  write_shard(tmp, 0, 1, shard);
  commit_sharded_save(tmp, root / "ckpt", 1);
  EXPECT_LT(fs::file_size(root / "ckpt/rank_0.ckpt"), 10000u) << "the whole buffer was saved";
  expect_same_bits(torch::arange(10, 15, torch::kFloat32), load_sharded(root / "ckpt").tensors.at("state_dict/w"), "w");
}

TEST(ShardedCheckpointTest, ReadsOnlyTheRankFilesItNeeds) {
  TempDir root{"lockstep_sharded"};
  const std::string dir = root / "ckpt";
  Tensors tensors{{"state_dict/w", torch::randn({30})}};
  save(dir, tensors, even_layout(tensors, 3), sample_common(1));
  write_text(dir + "/rank_2.ckpt", "damaged");
  const auto mine = load_sharded_pieces(dir, {{"state_dict/w", {5, 12}}});  // ranks 0 and 1 only
  expect_same_bits(tensors["state_dict/w"].narrow(0, 5, 12), mine.pieces.at("state_dict/w").values, "w");
  expect_error(
      [&] {
        load_sharded_pieces(dir, {{"state_dict/w", {15, 12}}});
      },
      {dir + "/rank_2.ckpt", "is not a Lockstep checkpoint"});
}

TEST(ShardedCheckpointTest, AMissingOrDamagedRankFileIsRefusedWithItsPath) {
  TempDir root{"lockstep_sharded"};
  const std::string dir = root / "ckpt";
  const auto tensors = sample_tensors();
  save(dir, tensors, even_layout(tensors, 2), sample_common(1));
  const std::string rank1 = dir + "/rank_1.ckpt";
  fs::copy_file(rank1, root / "rank_1.bak");

  fs::resize_file(rank1, fs::file_size(rank1) / 2);
  expect_error([&] { load_sharded(dir); }, {"'" + rank1 + "'", "damaged"});
  fs::remove(rank1);
  expect_error([&] { load_sharded(dir); },
               {"'" + dir + "'", "rank_1.ckpt is missing", "world_size 2", "copy the whole directory"});
  expect_error([&] { load_sharded_pieces(dir, {{"state_dict/fc.weight", {20, 4}}}); }, {"rank_1.ckpt is missing"});
  fs::copy_file(root / "rank_1.bak", rank1);
  expect_full(load_sharded(dir), tensors, 1);
}

TEST(ShardedCheckpointTest, FilesOfAnotherWorldSizeAreRefused) {
  TempDir root{"lockstep_sharded"};
  const auto tensors = sample_tensors();
  const std::string two = root / "two", three = root / "three";
  save(two, tensors, even_layout(tensors, 2), sample_common(1));
  save(three, tensors, even_layout(tensors, 3), sample_common(1));
  const std::string metadata_two = read_text(two + "/metadata.json");
  write_text(two + "/metadata.json", read_text(three + "/metadata.json"));
  expect_error([&] { load_sharded(two); }, {"'" + two + "/rank_0.ckpt'", "world_size 2 but metadata.json says 3"});
  write_text(two + "/metadata.json", metadata_two);
  fs::copy_file(three + "/rank_2.ckpt", two + "/rank_2.ckpt");
  expect_error([&] { load_sharded(two); }, {"'" + two + "'", "holds rank_2.ckpt but metadata.json says world_size 2"});
  fs::remove(two + "/rank_2.ckpt");
  fs::copy_file(three + "/rank_1.ckpt", two + "/rank_1.ckpt", fs::copy_options::overwrite_existing);
  expect_error([&] { load_sharded(two); }, {"'" + two + "/rank_1.ckpt'", "world_size 3 but metadata.json says 2"});
}

TEST(ShardedCheckpointTest, MissingOrDamagedMetadataIsRefused) {
  TempDir root{"lockstep_sharded"};
  const std::string dir = root / "ckpt";
  expect_error([&] { load_sharded(dir); }, {"'" + dir + "'", "does not exist"});
  const auto tensors = sample_tensors();
  save(dir, tensors, even_layout(tensors, 2), sample_common(1));
  expect_error([&] { load_sharded(dir + "/rank_0.ckpt"); }, {"is a file", "CheckpointIO::load"});
  const std::string good = read_text(dir + "/metadata.json");
  write_text(dir + "/metadata.json", good.substr(0, good.size() / 2));
  expect_error([&] { load_sharded(dir); }, {"'" + dir + "/metadata.json'", "damaged"});
  auto future = nlohmann::json::parse(good);
  future["version"] = 2;
  write_text(dir + "/metadata.json", future.dump());
  expect_error([&] { load_sharded(dir); }, {"format version 2", "reads version 1"});
  fs::remove(dir + "/metadata.json");
  EXPECT_FALSE(is_sharded_checkpoint(dir));
  expect_error([&] { load_sharded(dir); }, {"'" + dir + "'", "no metadata.json", "did not complete"});
}

TEST(ShardedCheckpointTest, PiecesThatOverlapOrLeaveAGapAreRefused) {
  TempDir root{"lockstep_sharded"};
  const std::string dir = root / "ckpt";
  Tensors tensors{{"state_dict/w", torch::randn({10})}};
  save(dir, tensors, even_layout(tensors, 2), sample_common(1));
  const std::string good_metadata = read_text(dir + "/metadata.json");
  const auto refused_at_commit = [&](const Layout& layout, const std::vector<std::string>& parts) {
    Tensors other{{"state_dict/w", torch::zeros({10})}};
    expect_error([&] { save(dir, other, layout, sample_common(2)); }, parts);
    expect_full(load_sharded(dir), tensors, 1);  // the previous checkpoint is untouched
  };
  refused_at_commit({{{"state_dict/w", {0, 6}}}, {{"state_dict/w", {4, 6}}}},
                    {"\"state_dict/w\"", "rank 1's elements [4, 10) overlap rank 0's", "is unchanged"});
  refused_at_commit({{{"state_dict/w", {0, 4}}}, {{"state_dict/w", {5, 5}}}},
                    {"elements [4, 5) are in no rank's piece"});
  refused_at_commit({{{"state_dict/w", {0, 4}}}, {{"state_dict/w", {0, 0}}}},
                    {"elements [4, 10) are in no rank's piece"});

  // The same found in metadata.json at load.
  auto metadata = nlohmann::json::parse(good_metadata);
  metadata["tensors"]["state_dict/w"]["ranks"][1]["begin"] = 3;
  write_text(dir + "/metadata.json", metadata.dump());
  expect_error([&] { load_sharded(dir); }, {"'" + dir + "/metadata.json'", "\"state_dict/w\"", "overlap"});
  metadata["tensors"]["state_dict/w"]["ranks"][1]["begin"] = 6;
  metadata["tensors"]["state_dict/w"]["ranks"][1]["numel"] = 4;
  write_text(dir + "/metadata.json", metadata.dump());
  expect_error([&] { load_sharded(dir); }, {"elements [5, 6) are in no rank's piece"});
}

TEST(ShardedCheckpointTest, PiecesThatDisagreeOrAreMalformedAreRefused) {
  TempDir root{"lockstep_sharded"};
  const std::string tmp = begin_sharded_save(root / "ckpt", 0);
  ShardedCheckpoint a, b;
  a.pieces["state_dict/w"] = {{2, 3}, 0, torch::zeros({3})};
  b.pieces["state_dict/w"] = {{3, 2}, 3, torch::zeros({3})};
  write_shard(tmp, 0, 2, a);
  expect_error([&] { commit_sharded_save(tmp, root / "ckpt", 2); }, {"rank 1's shard is not in", "write_shard"});
  write_shard(tmp, 1, 2, b);
  expect_error([&] { commit_sharded_save(tmp, root / "ckpt", 2); }, {"\"state_dict/w\" disagree", "[3, 2]", "[2, 3]"});
  EXPECT_FALSE(fs::exists(root / "ckpt"));

  ShardedCheckpoint bad;
  bad.pieces["state_dict/w"] = {{2, 3}, 0, torch::zeros({2, 3})};
  expect_error([&] { write_shard(tmp, 0, 1, bad); }, {"\"state_dict/w\"", "1-D"});
  bad.pieces["state_dict/w"] = {{2, 3}, 4, torch::zeros({3})};
  expect_error([&] { write_shard(tmp, 0, 1, bad); }, {"[4, 7)", "outside its 6 elements"});
  bad.pieces = {{"state_dict//w", {{1}, 0, torch::zeros({1})}}};
  expect_error([&] { write_shard(tmp, 0, 1, bad); }, {"empty name"});
  expect_error([&] { write_shard(tmp, 2, 2, a); }, {"rank 2 is not in [0, world_size=2)"});
}

TEST(ShardedCheckpointTest, WantedRangesMustExistInTheCheckpoint) {
  TempDir root{"lockstep_sharded"};
  const std::string dir = root / "ckpt";
  const auto tensors = sample_tensors();
  save(dir, tensors, even_layout(tensors, 2), sample_common(1));
  expect_error(
      [&] {
        load_sharded_pieces(dir, {{"state_dict/fc2.weight", {0, 1}}});
      },
      {"'" + dir + "'", "no tensor \"state_dict/fc2.weight\""});
  expect_error(
      [&] {
        load_sharded_pieces(dir, {{"state_dict/fc.bias", {2, 3}}});
      },
      {"[2, 5)", "outside its 4 elements"});
  expect_error([&] { cut_pieces(tensors, {{"state_dict/x", {0, 1}}}); }, {"no full tensor \"state_dict/x\""});
}

// A save killed at any step (a rank's file half written, all written but not committed, the
// commit half done) leaves the previous checkpoint loadable, and the next save succeeds.
TEST(ShardedCheckpointTest, AnInterruptedSaveLeavesThePreviousCheckpoint) {
  TempDir root{"lockstep_sharded"};
  const std::string dir = root / "last";
  const auto tensors = sample_tensors();
  save(dir, tensors, even_layout(tensors, 2), sample_common(1));
  Tensors next;
  for (const auto& [key, tensor] : tensors) next[key] = tensor * 2;
  const Layout layout = even_layout(next, 3);
  const auto write_ranks = [&](const std::vector<int>& ranks) {
    const std::string tmp = begin_sharded_save(dir, 0);
    for (const int r : ranks) {
      ShardedCheckpoint shard;
      shard.pieces = cut_pieces(next, layout[r]);
      write_shard(tmp, r, 3, shard);
    }
    return tmp;
  };

  const std::string tmp = write_ranks({0});
  write_text(tmp + "/rank_1.ckpt.tmp.Ab12Cd", "half a file");  // rank 1 killed while writing
  expect_full(load_sharded(dir), tensors, 1);
  write_ranks({0, 1, 2});  // killed before rank 0 committed
  expect_full(load_sharded(dir), tensors, 1);
  fs::rename(dir, dir + ".old");  // killed between the two renames of a commit without RENAME_EXCHANGE
  expect_error([&] { load_sharded(dir); }, {"moved it to '" + dir + ".old'"});
  const std::string again = write_ranks({});  // begin_sharded_save puts it back
  EXPECT_EQ(names_in(again), std::vector<std::string>{}) << "leftovers of the interrupted save";
  expect_full(load_sharded(dir), tensors, 1);

  save(dir, next, layout, sample_common(2));
  expect_full(load_sharded(dir), next, 2);
  EXPECT_EQ(names_in(root.path()), std::vector<std::string>{"last"});
}

// A process saving in a loop, killed with SIGKILL at arbitrary moments: the checkpoint directory
// always loads, whole and consistent (all tensors of one save).
TEST(ShardedCheckpointTest, KillNineWhileSavingLeavesACompleteCheckpoint) {
  TempDir root{"lockstep_sharded"};
  const std::string dir = root / "last";
  const auto version = [](int64_t v) {
    Tensors tensors;
    for (const char* key : {"state_dict/a", "state_dict/b", "optimizer_states/0/state/0/exp_avg"}) {
      tensors[key] = torch::full({2000}, static_cast<float>(v));
    }
    return tensors;
  };
  save(dir, version(0), even_layout(version(0), 3), sample_common(0));
  int64_t last_seen = 0;
  for (int round = 0; round < 16; ++round) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      try {
        for (int64_t v = last_seen + 1;; ++v) save(dir, version(v), even_layout(version(v), 3), sample_common(v));
      } catch (...) {
      }
      ::_exit(1);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10 + 7 * round));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the saving process ended by itself (status " << status << ")";
    ReassembledCheckpoint loaded;
    ASSERT_NO_THROW(loaded = load_sharded(dir)) << "round " << round << ": " << error_of([&] { load_sharded(dir); });
    const int64_t v = loaded.common.at("epoch").toInt();
    EXPECT_GE(v, last_seen) << "round " << round;
    expect_full(loaded, version(v), v);
    last_seen = v;
  }
  EXPECT_GT(last_seen, 0) << "no save completed in 16 rounds";
}

TEST(ShardedCheckpointTest, ToFullCheckpointNestsThePiecesAsPythonLaysThemOut) {
  auto state = c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get());
  auto step = c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
  step.insert("step", torch::tensor(3.0, torch::kFloat64));
  state.insert(int64_t{0}, step);
  auto optimizer = c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
  optimizer.insert("state", state);
  optimizer.insert("param_groups", c10::impl::GenericList(c10::AnyType::get()));
  c10::impl::GenericList optimizers(c10::AnyType::get());
  optimizers.push_back(optimizer);
  auto common = sample_common(4);
  common.insert("optimizer_states", optimizers);

  const auto w = torch::randn({2, 2}), m0 = torch::randn({2, 2}), m1 = torch::randn({3});
  const auto full = to_full_checkpoint(common, {{"state_dict/fc.weight", w},
                                                {"optimizer_states/0/state/0/exp_avg", m0},
                                                {"optimizer_states/0/state/1/exp_avg", m1}});
  EXPECT_EQ(full.at("epoch").toInt(), 4);
  EXPECT_TRUE(full.at("state_dict").toGenericDict().at("fc.weight").toTensor().equal(w));
  const auto full_state = full.at("optimizer_states").toListRef()[0].toGenericDict().at("state").toGenericDict();
  EXPECT_TRUE(full_state.at(int64_t{0}).toGenericDict().at("exp_avg").toTensor().equal(m0));
  EXPECT_EQ(full_state.at(int64_t{0}).toGenericDict().at("step").toTensor().item<double>(), 3.0);
  EXPECT_TRUE(full_state.at(int64_t{1}).toGenericDict().at("exp_avg").toTensor().equal(m1)) << "a new int key";
  EXPECT_FALSE(step.contains("exp_avg")) << "the common dict was changed";
  EXPECT_FALSE(common.contains("state_dict"));

  expect_error([&] { to_full_checkpoint(common, {{"epoch/x", w}}); }, {"\"epoch/x\"", "\"epoch\" is an int"});
  expect_error(
      [&] {
        to_full_checkpoint(common, {{"optimizer_states", w}});
      },
      {"\"optimizer_states\" cannot be placed", "holds a list there"});
  expect_error([&] { to_full_checkpoint(common, {{"optimizer_states/2/x", w}}); }, {"not an index into the list of 1"});
}

const char* const kPythonReader = R"(
import sys, torch
ckpt = torch.load(sys.argv[1])
model = torch.nn.Linear(6, 4)
model.load_state_dict(ckpt["state_dict"], strict=True)
adam = torch.optim.Adam(model.parameters(), lr=0.01)
adam.load_state_dict(ckpt["optimizer_states"][0])
hexes = lambda t: t.detach().contiguous().numpy().tobytes().hex()
for name, p in model.named_parameters():
    print("param", name, hexes(p))
for i, s in sorted(adam.state_dict()["state"].items()):
    print("exp_avg", i, hexes(s["exp_avg"]))
    print("exp_avg_sq", i, hexes(s["exp_avg_sq"]))
    print("step", i, int(s["step"]))
print("epoch", ckpt["epoch"], "lr", adam.param_groups[0]["lr"])
shard = torch.load(sys.argv[2])
print("rank_file", shard["rank"], shard["world_size"], ",".join(sorted(shard["pieces"])), shard["common"])
)";

std::string hex_of(const at::Tensor& tensor) {
  const auto t = tensor.contiguous();
  const auto* bytes = static_cast<const unsigned char*>(t.data_ptr());
  std::string out;
  for (size_t i = 0; i < t.nbytes(); ++i) {
    static const char* const digits = "0123456789abcdef";
    out += digits[bytes[i] >> 4];
    out += digits[bytes[i] & 15];
  }
  return out;
}

// A model and Adam, sharded over 2 ranks as the engine would (the tensors in pieces, the rest in
// common), put back into one file that Python's torch.load and Adam.load_state_dict read.
TEST(ShardedCheckpointTest, TheFullCheckpointLoadsInPython) {
  if (!fs::exists(LOCKSTEP_TEST_PYTHON)) GTEST_SKIP() << LOCKSTEP_TEST_PYTHON << " is not installed";
  torch::manual_seed(3);
  torch::nn::Linear model(6, 4);
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(0.01));
  for (int i = 0; i < 2; ++i) {
    adam.zero_grad();
    model->forward(torch::randn({5, 6})).pow(2).mean().backward();
    adam.step();
  }
  Tensors tensors;
  for (const auto& entry : state_dict(*model)) tensors["state_dict/" + entry.key()] = entry.value();
  auto optimizer = optimizer_state_dict(adam);
  for (const auto& entry : optimizer.at("state").toGenericDict()) {
    auto state = entry.value().toGenericDict();
    for (const std::string name : {"exp_avg", "exp_avg_sq"}) {
      tensors["optimizer_states/0/state/" + std::to_string(entry.key().toInt()) + "/" + name] =
          state.at(name).toTensor();
      (void)state.erase(name);
    }
  }
  auto common = sample_common(7);
  c10::impl::GenericList optimizers(c10::AnyType::get());
  optimizers.push_back(optimizer);
  common.insert("optimizer_states", optimizers);

  TempDir root{"lockstep_sharded"};
  save(root / "sharded", tensors, flat_layout(tensors, 2), common);
  CheckpointIO().save(to_full_checkpoint(load_sharded(root / "sharded")), root / "full.ckpt");

  const auto result = testing::run_command(
      {LOCKSTEP_TEST_PYTHON, "-c", kPythonReader, root / "full.ckpt", root / "sharded/rank_1.ckpt"},
      {{"OMP_NUM_THREADS", "1"}, {"HOME", root.path()}}, std::chrono::seconds(60));
  if (result.err.find("No module named 'torch'") != std::string::npos) {
    GTEST_SKIP() << LOCKSTEP_TEST_PYTHON << " has no torch (apt-get install python3-torch)";
  }
  ASSERT_EQ(result.exit_code, 0) << result.out << result.err;
  std::vector<std::string> expected{"param weight " + hex_of(model->weight), "param bias " + hex_of(model->bias)};
  for (int i = 0; i < 2; ++i) {
    const std::string prefix = "optimizer_states/0/state/" + std::to_string(i) + "/";
    expected.push_back("exp_avg " + std::to_string(i) + " " + hex_of(tensors.at(prefix + "exp_avg")));
    expected.push_back("exp_avg_sq " + std::to_string(i) + " " + hex_of(tensors.at(prefix + "exp_avg_sq")));
    expected.push_back("step " + std::to_string(i) + " 2");
  }
  expected.push_back("epoch 7 lr 0.01");
  std::string joined;  // every rank has a piece of every key, most of them empty here
  for (const auto& entry : tensors) joined += (joined.empty() ? "" : ",") + entry.first;
  expected.push_back("rank_file 1 2 " + joined + " {}");
  EXPECT_EQ(result.out_lines(), expected) << result.err;
}

}  // namespace
}  // namespace sharded_checkpoint_test
}  // namespace checkpoint
}  // namespace lockstep
