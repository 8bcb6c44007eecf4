// Checkpoints in torch.distributed.checkpoint's format (checkpoint/dcp_checkpoint.h): folders that
// Python's dcp.save wrote load whole and cut into pieces; Lockstep's writes reshard on reading and
// Python's dcp.load reads them bit for bit; bad folders are one clear error. The Python peer is
// DCP's (support/dcp_python.h); tests that need it skip, naming it, where it is absent.
#include <lockstep/checkpoint/dcp_checkpoint.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <lockstep/checkpoint/checkpoint_io.h>
#include <lockstep/core/error.h>

#include "../../support/dcp_python.h"
#include "../../support/temp_dir.h"

namespace lockstep {
namespace dcp_checkpoint_test {

using checkpoint::PieceRange;
using checkpoint::ShardedCheckpoint;

const char* const kPythonPlain = R"(
import sys, torch, torch.distributed.checkpoint as dcp
torch.manual_seed(0)
model = {"fc.weight": torch.randn(5, 3), "fc.bias": torch.randn(5).double(), "emb": torch.randn(4).bfloat16()}
dcp.save({"model": model, "epoch": 3, "note": "hi"}, checkpoint_id=sys.argv[1] + "/ckpt", no_dist=True)
dcp.save(model, checkpoint_id=sys.argv[1] + "/plain", no_dist=True)  # keys without "model."
torch.save(model, sys.argv[1] + "/expected.pt")
)";

testing::CommandResult run_python(const std::string& python, const std::string& script, const std::string& dir) {
  return testing::run_command({python, "-c", script, dir}, {{"OMP_NUM_THREADS", "1"}, {"HOME", dir}},
                              std::chrono::seconds(120));
}

// A Python dict of tensors written by dcp.save loads whole, and a range across rows loads alone.
TEST(DcpCheckpoint, ReadsWhatPythonsDcpSaveWrote) {
  LOCKSTEP_REQUIRE_DCP_PYTHON(python);
  testing::TempDir dir("lockstep_dcp_read");
  const auto written = run_python(python, kPythonPlain, dir.path());
  ASSERT_EQ(written.exit_code, 0) << written.err;
  const std::string path = dir / "ckpt";
  ASSERT_TRUE(checkpoint::is_dcp_checkpoint(path));
  const auto expected = checkpoint::CheckpointIO().load(dir / "expected.pt");
  const auto whole = checkpoint::load_dcp(path);
  ASSERT_EQ(whole.tensors.size(), 3u);
  for (const auto& entry : expected) {
    const auto& name = entry.key().toStringRef();
    const auto& got = whole.tensors.at("state_dict/" + name);
    EXPECT_EQ(got.scalar_type(), entry.value().toTensor().scalar_type()) << name;
    EXPECT_TRUE(got.equal(entry.value().toTensor())) << name;
  }
  EXPECT_EQ(whole.common.at("epoch").toInt(), 3);
  EXPECT_EQ(whole.common.at("note").toStringRef(), "hi");
  const auto info = checkpoint::read_dcp_tensors(path);
  EXPECT_EQ(info.at("state_dict/fc.weight").shape, (std::vector<int64_t>{5, 3}));
  const auto piece = checkpoint::load_dcp_pieces(path, {{"state_dict/fc.weight", {4, 7}}});
  const auto weight = expected.at("fc.weight").toTensor();
  EXPECT_TRUE(piece.pieces.at("state_dict/fc.weight").values.equal(weight.flatten().narrow(0, 4, 7)));
  const auto plain = checkpoint::load_dcp(dir / "plain");
  ASSERT_EQ(plain.tensors.count("state_dict/fc.weight"), 1u);
  EXPECT_TRUE(plain.tensors.at("state_dict/fc.weight").equal(weight));
}

// Two ranks' pieces of a model and Adam's state, cut mid-row, as FSDP holds them.
struct Saved {
  at::Tensor weight = torch::arange(15, torch::kFloat32).reshape({5, 3}) / 7;
  at::Tensor bias = torch::arange(5, torch::kFloat64) * 3;
  at::Tensor exp_avg = torch::arange(15, torch::kFloat32).reshape({5, 3}) / 11;
  at::Tensor count = torch::tensor(int64_t{9});
};

ShardedCheckpoint shard_of(const Saved& s, int rank) {
  const int64_t split = 7;  // rank 0: weight elements [0, 7), rank 1: [7, 15)
  ShardedCheckpoint shard;
  const auto piece = [&](const at::Tensor& t, int64_t begin, int64_t n) {
    return checkpoint::TensorPiece{t.sizes().vec(), begin, t.flatten().narrow(0, begin, n)};
  };
  shard.pieces["state_dict/fc.weight"] = rank == 0 ? piece(s.weight, 0, split) : piece(s.weight, split, 15 - split);
  shard.pieces["state_dict/fc.bias"] = rank == 0 ? piece(s.bias, 0, 5) : piece(s.bias, 5, 0);
  shard.pieces["state_dict/count"] = rank == 0 ? checkpoint::TensorPiece{{}, 0, s.count.reshape({1})}
                                               : checkpoint::TensorPiece{{}, 0, s.count.reshape({1}).narrow(0, 0, 0)};
  shard.pieces["optimizer_states/0/state/0/exp_avg"] = rank == 0 ? piece(s.exp_avg, 0, 2) : piece(s.exp_avg, 2, 13);
  c10::impl::GenericDict step(c10::StringType::get(), c10::AnyType::get());
  step.insert("step", torch::tensor(4.0, torch::kFloat64));
  c10::impl::GenericDict state(c10::IntType::get(), c10::AnyType::get());
  state.insert(int64_t{0}, step);
  c10::impl::GenericDict group(c10::StringType::get(), c10::AnyType::get());
  group.insert("lr", 0.01);
  group.insert("betas", c10::ivalue::Tuple::create({0.9, 0.999}));
  group.insert("params", c10::List<int64_t>({0, 1}));
  c10::impl::GenericDict optimizer(c10::StringType::get(), c10::AnyType::get());
  optimizer.insert("state", state);
  optimizer.insert("param_groups", c10::impl::GenericList(c10::AnyType::get()));
  optimizer.at("param_groups").toList().push_back(group);
  c10::impl::GenericList optimizers(c10::AnyType::get());
  optimizers.push_back(optimizer);
  shard.common.insert("optimizer_states", optimizers);
  shard.common.insert("epoch", int64_t{2});
  return shard;
}

std::string save_two_ranks(const testing::TempDir& dir, const Saved& saved) {
  const std::string path = dir / "lockstep.dcp";
  for (int rank = 0; rank < 2; ++rank) {
    const auto tmp = checkpoint::begin_sharded_save(path, rank);
    checkpoint::write_dcp_shard(tmp, rank, 2, shard_of(saved, rank), {"fc.weight", "fc.bias"});
  }
  checkpoint::commit_dcp_save(path + ".tmp", path, 2);
  return path;
}

// What two ranks wrote reads back on three (other ranges), with the common part.
TEST(DcpCheckpoint, WritesTwoRanksAndReadsThemAsThree) {
  testing::TempDir dir("lockstep_dcp_write");
  const Saved saved;
  const auto path = save_two_ranks(dir, saved);
  ASSERT_TRUE(checkpoint::is_dcp_checkpoint(path));
  ASSERT_FALSE(checkpoint::is_sharded_checkpoint(path));
  for (const auto& [begin, numel] : std::vector<std::pair<int64_t, int64_t>>{{0, 5}, {5, 5}, {10, 5}, {1, 13}}) {
    const auto mine = checkpoint::load_dcp_pieces(
        path, {{"state_dict/fc.weight", {begin, numel}}, {"optimizer_states/0/state/0/exp_avg", {begin, numel}}});
    EXPECT_TRUE(mine.pieces.at("state_dict/fc.weight").values.equal(saved.weight.flatten().narrow(0, begin, numel)))
        << begin;
    EXPECT_TRUE(mine.pieces.at("optimizer_states/0/state/0/exp_avg").values.equal(
        saved.exp_avg.flatten().narrow(0, begin, numel)))
        << begin;
  }
  const auto whole = checkpoint::to_full_checkpoint(checkpoint::load_dcp(path));
  EXPECT_TRUE(whole.at("state_dict").toGenericDict().at("fc.bias").toTensor().equal(saved.bias));
  EXPECT_TRUE(whole.at("state_dict").toGenericDict().at("count").toTensor().equal(saved.count));
  EXPECT_EQ(whole.at("epoch").toInt(), 2);
  const auto optimizer = whole.at("optimizer_states").toListRef()[0].toGenericDict();
  const auto group = optimizer.at("param_groups").toListRef()[0].toGenericDict();
  EXPECT_DOUBLE_EQ(group.at("lr").toDouble(), 0.01);
  EXPECT_EQ(group.at("params").toListRef().size(), 2u);
  EXPECT_EQ(group.at("params").toListRef()[1].toInt(), 1);
  const auto state = optimizer.at("state").toGenericDict().at(int64_t{0}).toGenericDict();
  EXPECT_EQ(state.at("step").toTensor().item<double>(), 4.0);
  EXPECT_TRUE(state.at("exp_avg").toTensor().equal(saved.exp_avg));
}

const char* const kPythonLoad = R"(
import sys, torch, torch.distributed.checkpoint as dcp
target = {"model": {"fc.weight": torch.zeros(5, 3), "fc.bias": torch.zeros(5, dtype=torch.float64),
                    "count": torch.tensor(0)},
          "optim": {"state": {"fc.weight": {"exp_avg": torch.zeros(5, 3), "step": torch.tensor(0.0)}},
                    "param_groups": [{"lr": 0.0, "betas": (0.0, 0.0), "params": []}]},
          "epoch": 0}
dcp.load(target, checkpoint_id=sys.argv[1] + "/lockstep.dcp", no_dist=True)
torch.save({"weight": target["model"]["fc.weight"], "bias": target["model"]["fc.bias"],
            "count": target["model"]["count"], "exp_avg": target["optim"]["state"]["fc.weight"]["exp_avg"],
            "step": target["optim"]["state"]["fc.weight"]["step"]}, sys.argv[1] + "/loaded.pt")
g = target["optim"]["param_groups"][0]
print(target["epoch"], g["lr"], g["betas"][1], ",".join(g["params"]))
)";

// Python's dcp.load reads Lockstep's folder: the tensors bit for bit, the Python values as saved.
TEST(DcpCheckpoint, PythonsDcpLoadReadsLockstepsFolderBitForBit) {
  LOCKSTEP_REQUIRE_DCP_PYTHON(python);
  testing::TempDir dir("lockstep_dcp_python_load");
  const Saved saved;
  save_two_ranks(dir, saved);
  const auto loaded_by_python = run_python(python, kPythonLoad, dir.path());
  ASSERT_EQ(loaded_by_python.exit_code, 0) << loaded_by_python.err;
  EXPECT_EQ(loaded_by_python.out, "2 0.01 0.999 fc.weight,fc.bias\n");
  const auto loaded = checkpoint::CheckpointIO().load(dir / "loaded.pt");
  EXPECT_TRUE(loaded.at("weight").toTensor().equal(saved.weight));
  EXPECT_TRUE(loaded.at("bias").toTensor().equal(saved.bias));
  EXPECT_TRUE(loaded.at("count").toTensor().equal(saved.count));
  EXPECT_TRUE(loaded.at("exp_avg").toTensor().equal(saved.exp_avg));
  EXPECT_EQ(loaded.at("step").toTensor().item<double>(), 4.0);
}

void expect_refused(const std::string& path, const std::string& part) {
  try {
    checkpoint::load_dcp(path);
    ADD_FAILURE() << "accepted; expected an error naming: " << part;
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// A folder without .metadata, a cut one, a pickle that names a foreign global and a .distcp file
// cut short are each one UsageError that says what is wrong.
TEST(DcpCheckpoint, BadFoldersAreRefusedWithTheReason) {
  testing::TempDir dir("lockstep_dcp_bad");
  const Saved saved;
  const auto path = save_two_ranks(dir, saved);
  const auto metadata = testing::slurp(path + "/.metadata");
  const auto data = testing::slurp(path + "/__1_0.distcp");

  write_file(path + "/.metadata", metadata.substr(0, metadata.size() / 2));
  expect_refused(path, "truncated");
  static const char kForeign[] = "\x80\x02" "cos\nsystem\n" "X\x02\0\0\0ls" "\x85R.";  // os.system("ls")
  write_file(path + "/.metadata", std::string(kForeign, sizeof kForeign - 1));
  expect_refused(path, "names the global os.system");
  write_file(path + "/.metadata", metadata);
  write_file(path + "/__1_0.distcp", data.substr(0, data.size() - 100));
  expect_refused(path, "truncated");
  std::filesystem::remove(path + "/.metadata");
  EXPECT_FALSE(checkpoint::is_dcp_checkpoint(path));
  expect_refused(path, "no .metadata");
}

// A 3-D tensor cut at points inside rows of both inner dimensions (3 ranks: [0, 7), [7, 33),
// [33, 60)) is written as boxes that cover it exactly once, and every range of it reads back.
TEST(DcpCheckpoint, PiecesCutInsideRowsOfA3dTensorReadBackInAnyRange) {
  testing::TempDir dir("lockstep_dcp_3d");
  const auto full = torch::arange(60, torch::kFloat32).reshape({3, 4, 5});
  const std::string path = dir / "cube.dcp";
  const std::vector<int64_t> cuts{0, 7, 33, 60};
  for (int rank = 0; rank < 3; ++rank) {
    ShardedCheckpoint shard;
    shard.pieces["state_dict/cube"] = {{3, 4, 5}, cuts[rank], full.flatten().narrow(0, cuts[rank], cuts[rank + 1] - cuts[rank])};
    checkpoint::write_dcp_shard(checkpoint::begin_sharded_save(path, rank), rank, 3, shard, {});
  }
  checkpoint::commit_dcp_save(path + ".tmp", path, 3);
  for (int64_t begin = 0; begin < 60; begin += 3) {
    for (int64_t numel = 0; begin + numel <= 60; numel += 7) {
      const auto mine = checkpoint::load_dcp_pieces(path, {{"state_dict/cube", {begin, numel}}});
      ASSERT_TRUE(mine.pieces.at("state_dict/cube").values.equal(full.flatten().narrow(0, begin, numel)))
          << "[" << begin << ", " << begin + numel << ")";
    }
  }
}

// DCP holds one optimizer: the state of a second is refused with the fix, before a file is made.
TEST(DcpCheckpoint, ASecondOptimizerIsRefusedWithTheFix) {
  testing::TempDir dir("lockstep_dcp_two_optimizers");
  const Saved saved;
  auto shard = shard_of(saved, 0);
  shard.pieces["optimizer_states/1/state/0/exp_avg"] = shard.pieces.at("optimizer_states/0/state/0/exp_avg");
  const auto tmp = checkpoint::begin_sharded_save(dir / "two.dcp", 0);
  try {
    checkpoint::write_dcp_shard(tmp, 0, 1, shard, {"fc.weight", "fc.bias"});
    ADD_FAILURE() << "a second optimizer's state was written";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("StateDictType::sharded"), std::string::npos) << e.what();
  }
}

// Every cut of a good .metadata is refused, and every byte of it changed either loads or is
// refused: never a crash, a hang or another exception (the dcp_metadata fuzz target goes further).
TEST(DcpCheckpoint, EveryCutAndChangedByteOfTheMetadataIsOneClearAnswer) {
  testing::TempDir dir("lockstep_dcp_cuts");
  const Saved saved;
  const auto path = save_two_ranks(dir, saved);
  const auto metadata = testing::slurp(path + "/.metadata");
  ASSERT_GT(metadata.size(), 500u);
  size_t refused = 0;
  for (size_t n = 0; n < metadata.size(); ++n) {
    write_file(path + "/.metadata", metadata.substr(0, n));
    EXPECT_THROW(checkpoint::load_dcp(path), UsageError) << "cut at " << n;
  }
  for (size_t i = 0; i < metadata.size(); ++i) {
    std::string changed = metadata;
    changed[i] = static_cast<char>(changed[i] ^ 0x5a);
    write_file(path + "/.metadata", changed);
    try {
      checkpoint::load_dcp(path);
    } catch (const UsageError&) {
      ++refused;
    }
  }
  EXPECT_GT(refused, metadata.size() / 2);
}

}  // namespace dcp_checkpoint_test
}  // namespace lockstep
