// `lockstep ckpt inspect` and `convert`, run as a user runs them: each format listed, round trips
// between formats bit-identical (loaded back with the library), Python reading the converted
// files, the note on what a format leaves out, progress lines, and bad input.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <lockstep/checkpoint/checkpoint_io.h>
#include <lockstep/checkpoint/dcp_checkpoint.h>
#include <lockstep/checkpoint/optimizer_state.h>
#include <lockstep/checkpoint/safetensors.h>
#include <lockstep/checkpoint/sharded_checkpoint.h>
#include <lockstep/checkpoint/state_dict.h>

#include "../support/command.h"
#include "../support/paths.h"
#include "../support/temp_dir.h"

namespace lockstep {
namespace ckpt_command_test {

namespace fs = std::filesystem;
using checkpoint::Checkpoint;
using testing::CommandResult;

CommandResult ckpt(const std::vector<std::string>& args) {
  std::vector<std::string> argv{std::string(LOCKSTEP_BIN_DIR) + "/lockstep", "ckpt"};
  argv.insert(argv.end(), args.begin(), args.end());
  return testing::run_command(argv, {{"PATH", "/usr/bin:/bin"}, {"HOME", "/tmp"}, {"OMP_NUM_THREADS", "1"}});
}

// A small model with a buffer of int64 (BatchNorm's num_batches_tracked), after one Adam step.
struct Trained {
  torch::nn::Sequential net{nullptr};
  std::unique_ptr<torch::optim::Adam> adam;
  Trained() {
    torch::manual_seed(7);
    net = torch::nn::Sequential(torch::nn::Linear(4, 6), torch::nn::BatchNorm1d(6), torch::nn::Linear(6, 3));
    adam = std::make_unique<torch::optim::Adam>(net->parameters(), torch::optim::AdamOptions(1e-2));
    net->forward(torch::randn({5, 4})).square().sum().backward();
    adam->step();
  }
  // As the Trainer lays a checkpoint out.
  Checkpoint full() const {
    Checkpoint ckpt = checkpoint::make_checkpoint();
    ckpt.insert("state_dict", checkpoint::state_dict(*net));
    c10::impl::GenericList optimizers(c10::AnyType::get());
    optimizers.push_back(checkpoint::optimizer_state_dict(*adam));
    ckpt.insert("optimizer_states", optimizers);
    ckpt.insert("epoch", int64_t{2});
    ckpt.insert("global_step", int64_t{8});
    Checkpoint loops = checkpoint::make_checkpoint();
    loops.insert("next_epoch", int64_t{3});
    ckpt.insert("loops", loops);
    ckpt.insert("lockstep_version", std::string("0.1.0"));
    return ckpt;
  }
  c10::Dict<std::string, torch::Tensor> weights() const { return checkpoint::state_dict(*net); }
};

// Equal as a round trip must be: the same keys in the same order, tensors of the same dtype and
// shape with the same elements, the same values.
void expect_same(const c10::IValue& expected, const c10::IValue& actual, const std::string& where) {
  if (expected.isTensor()) {
    ASSERT_TRUE(actual.isTensor()) << where;
    const auto& a = expected.toTensor();
    const auto& b = actual.toTensor();
    EXPECT_EQ(a.scalar_type(), b.scalar_type()) << where;
    ASSERT_EQ(a.sizes(), b.sizes()) << where;
    EXPECT_TRUE(torch::equal(a, b)) << where;
  } else if (expected.isGenericDict()) {
    ASSERT_TRUE(actual.isGenericDict()) << where;
    const auto a = expected.toGenericDict(), b = actual.toGenericDict();
    ASSERT_EQ(a.size(), b.size()) << where;
    auto it = b.begin();
    for (const auto& entry : a) {
      EXPECT_EQ(c10::str(entry.key()), c10::str(it->key())) << where;
      expect_same(entry.value(), it->value(), where + "/" + c10::str(entry.key()));
      ++it;
    }
  } else if (expected.isList()) {
    ASSERT_TRUE(actual.isList()) << where;
    const auto a = expected.toListRef(), b = actual.toListRef();
    ASSERT_EQ(a.size(), b.size()) << where;
    for (size_t i = 0; i < a.size(); ++i) expect_same(a[i], b[i], where + "/" + std::to_string(i));
  } else {
    EXPECT_EQ(c10::str(expected), c10::str(actual)) << where;
  }
}

// The dict of a checkpoint in any format, as the library reads it back.
c10::IValue load_back(const std::string& path) {
  if (checkpoint::is_sharded_checkpoint(path)) return checkpoint::to_full_checkpoint(checkpoint::load_sharded(path));
  return checkpoint::CheckpointIO().load(path);
}

void convert_ok(const std::vector<std::string>& args) {
  std::vector<std::string> all{"convert"};
  all.insert(all.end(), args.begin(), args.end());
  const auto result = ckpt(all);
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("lockstep ckpt: wrote " + args[1]), std::string::npos) << result.out;
}

// A sharded checkpoint (Lockstep's, or with `dcp` DCP's) written the way a 2-rank FSDP run writes
// one, without the command.
void write_sharded(const std::string& dir, const Trained& model, bool dcp = false) {
  std::map<std::string, at::Tensor> full;
  for (const auto& item : model.weights()) full["state_dict/" + item.key()] = item.value();
  Checkpoint common = checkpoint::make_checkpoint();
  common.insert("epoch", int64_t{5});
  common.insert("global_step", int64_t{40});
  const auto tmp = checkpoint::begin_sharded_save(dir, 0);
  for (int rank = 0; rank < 2; ++rank) {
    std::map<std::string, checkpoint::PieceRange> wanted;
    for (const auto& [key, tensor] : full) {
      const int64_t half = tensor.numel() / 2;
      wanted[key] = rank == 0 ? checkpoint::PieceRange{0, half} : checkpoint::PieceRange{half, tensor.numel() - half};
    }
    const checkpoint::ShardedCheckpoint shard{common, checkpoint::cut_pieces(full, wanted)};
    if (dcp) {
      checkpoint::write_dcp_shard(tmp, rank, 2, shard, {});  // as --fsdp-state-dict-type dcp writes it
    } else {
      checkpoint::write_shard(tmp, rank, 2, shard);
    }
  }
  if (dcp) {
    checkpoint::commit_dcp_save(tmp, dir, 2);
  } else {
    checkpoint::commit_sharded_save(tmp, dir, 2);
  }
}

bool has_line(const std::string& text, const std::string& start, const std::string& rest = "") {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(start, 0) == 0 && line.find(rest) != std::string::npos) return true;
  }
  return false;
}

TEST(LockstepCkpt, HelpListsTheSubcommands) {
  const auto help = ckpt({"--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("inspect"), std::string::npos) << help.out;
  EXPECT_NE(help.out.find("convert"), std::string::npos) << help.out;
  const auto top = testing::run_command({std::string(LOCKSTEP_BIN_DIR) + "/lockstep", "--help"}, {{"PATH", "/usr/bin"}});
  EXPECT_NE(top.out.find("ckpt"), std::string::npos) << top.out;
}

TEST(LockstepCkpt, InspectListsEachFormatsTensors) {
  testing::TempDir dir("lockstep_ckpt_inspect");
  const Trained model;
  checkpoint::CheckpointIO().save(model.full(), dir / "full.ckpt");
  checkpoint::CheckpointIO().save(model.weights(), dir / "weights.pt");
  checkpoint::save_safetensors(model.weights(), dir / "model.safetensors", {{"format", "pt"}});
  checkpoint::save_sharded_safetensors(model.weights(), dir / "model.safetensors.index.json", 100);
  write_sharded(dir / "sharded", model);
  write_sharded(dir / "dcp", model, /*dcp=*/true);
  struct Case {
    std::string path, format, weight_key;
  };
  const std::vector<Case> cases = {{"full.ckpt", "Lockstep full checkpoint file", "state_dict/0.weight"},
                                   {"weights.pt", "plain torch.save file", "0.weight"},
                                   {"model.safetensors", "safetensors file", "0.weight"},
                                   {"model.safetensors.index.json", "safetensors sharded index", "0.weight"},
                                   {"sharded", "Lockstep sharded checkpoint folder", "state_dict/0.weight"},
                                   {"dcp", "torch.distributed.checkpoint folder", "state_dict/0.weight"}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.path);
    const auto result = ckpt({"inspect", dir / c.path});
    ASSERT_EQ(result.exit_code, 0) << result.err;
    EXPECT_TRUE(has_line(result.out, dir / c.path + ": " + c.format)) << result.out;
    EXPECT_TRUE(has_line(result.out, "  " + c.weight_key + " ", "float32   [6, 4]")) << result.out;
    EXPECT_TRUE(has_line(result.out, "  " + c.weight_key.substr(0, c.weight_key.size() - 8) + "1.num_batches_tracked",
                         "int64     []"))
        << result.out;
    // 4*6+6 + 4*6 (BatchNorm) + 1 + 6*3+3 elements of weights
    EXPECT_TRUE(has_line(result.out, "tensors: ", "model weights")) << result.out;
    EXPECT_NE(result.out.find(": 76 parameters"), std::string::npos) << result.out;
  }
  const auto full = ckpt({"inspect", dir / "full.ckpt"});
  EXPECT_TRUE(has_line(full.out, "epoch: 2")) << full.out;
  EXPECT_TRUE(has_line(full.out, "global_step: 8")) << full.out;
  EXPECT_TRUE(has_line(full.out, "  optimizer_states/0/state/0/exp_avg ", "float32   [6, 4]")) << full.out;
  const auto sharded = ckpt({"inspect", dir / "sharded"});
  EXPECT_TRUE(has_line(sharded.out, "world_size: 2")) << sharded.out;
  EXPECT_TRUE(has_line(sharded.out, "global_step: 40")) << sharded.out;
  const auto dcp = ckpt({"inspect", dir / "dcp"});
  EXPECT_TRUE(has_line(dcp.out, "global_step: 40")) << dcp.out;
  // A DCP folder converts to the others: its weights are the model's, bit for bit.
  convert_ok({dir / "dcp", dir / "from_dcp.pt", "--to", "torch"});
  const auto back = load_back(dir / "from_dcp.pt").toGenericDict();
  EXPECT_EQ(back.at("global_step").toInt(), 40);
  for (const auto& item : model.weights()) {
    expect_same(item.value(), back.at("state_dict").toGenericDict().at(item.key()), "dcp -> torch " + item.key());
  }
}

// Each conversion, then back, gives the checkpoint it started from: the same keys in the same
// order, dtypes, shapes and elements (safetensors keeps the weights alone, by name).
TEST(LockstepCkpt, ConvertRoundTripsAreBitIdentical) {
  testing::TempDir dir("lockstep_ckpt_round");
  const Trained model;
  const Checkpoint full = model.full();
  checkpoint::CheckpointIO().save(full, dir / "full.ckpt");
  for (const std::string to : {"lockstep", "torch"}) {
    convert_ok({dir / "full.ckpt", dir / (to + ".ckpt"), "--to", to});
    expect_same(full, load_back(dir / (to + ".ckpt")), to);
  }
  convert_ok({dir / "full.ckpt", dir / "sharded3", "--to", "lockstep-sharded", "--world-size", "3"});
  EXPECT_EQ(checkpoint::read_sharded_metadata(dir / "sharded3").world_size, 3);
  expect_same(full, load_back(dir / "sharded3"), "sharded3");
  convert_ok({dir / "sharded3", dir / "sharded2", "--to", "lockstep-sharded", "--world-size", "2"});
  convert_ok({dir / "sharded2", dir / "from_sharded.ckpt", "--to", "lockstep"});
  expect_same(full, load_back(dir / "from_sharded.ckpt"), "sharded3 -> sharded2 -> lockstep");

  // The weights alone: a plain state_dict, safetensors and back.
  const c10::IValue weights = c10::impl::toGenericDict(model.weights());
  checkpoint::CheckpointIO().save(weights, dir / "weights.pt");
  convert_ok({dir / "weights.pt", dir / "w.safetensors", "--to", "safetensors"});
  convert_ok({dir / "w.safetensors", dir / "w_sharded", "--to", "lockstep-sharded", "--world-size", "4"});
  convert_ok({dir / "w_sharded", dir / "w.safetensors.index.json", "--to", "safetensors"});
  convert_ok({dir / "w.safetensors.index.json", dir / "w_back.pt", "--to", "torch"});
  const auto back = load_back(dir / "w_back.pt").toGenericDict();
  ASSERT_EQ(back.size(), weights.toGenericDict().size());
  for (const auto& item : weights.toGenericDict()) expect_same(item.value(), back.at(item.key()), c10::str(item.key()));
  convert_ok({dir / "weights.pt", dir / "w_lockstep.ckpt", "--to", "lockstep"});
  expect_same(weights, load_back(dir / "w_lockstep.ckpt").toGenericDict().at("state_dict"), "weights -> lockstep");
  convert_ok({dir / "w_lockstep.ckpt", dir / "w_torch.pt", "--to", "torch"});
  expect_same(weights, load_back(dir / "w_torch.pt"), "weights -> lockstep -> torch");
}

// The fit_end line's metrics of a fashion_mnist run (`extra` flags added), after it exits 0.
std::string fit_metrics(const std::string& root, const std::vector<std::string>& extra) {
  std::vector<std::string> argv{std::string(LOCKSTEP_BIN_DIR) + "/fashion_mnist", "--model", "mlp", "--seed", "1",
                                "--limit-train-batches", "3", "--limit-val-batches", "1", "--num-sanity-val-steps",
                                "0", "--enable-progress-bar", "false", "--timeout", "60", "--default-root-dir", root};
  argv.insert(argv.end(), extra.begin(), extra.end());
  const auto result = testing::run_command(argv, {{"PATH", "/usr/bin:/bin"}, {"HOME", "/tmp"}, {"OMP_NUM_THREADS", "1"},
                                                  {"LOCKSTEP_NO_BLAS_WARNING", "1"}},
                                           std::chrono::seconds(90));
  EXPECT_EQ(result.exit_code, 0) << result.err;
  for (const auto& line : result.out_lines()) {
    if (line.find("\"fit_end\"") != std::string::npos) return nlohmann::json::parse(line).at("metrics").dump();
  }
  ADD_FAILURE() << "no fit_end line: " << result.out << result.err;
  return "";
}

// A Trainer checkpoint converted to a 3-rank sharded one resumes on 2 FSDP ranks as the file
// itself does: the same metrics after the next epoch.
TEST(LockstepCkpt, TheTrainerResumesAConvertedShardedCheckpointAsTheFile) {
  testing::TempDir dir("lockstep_ckpt_resume");
  fit_metrics(dir / "first", {"--max-epochs", "1"});
  const std::string last = dir / "first/lockstep_logs/version_0/checkpoints/last.ckpt";
  convert_ok({last, dir / "sharded", "--to", "lockstep-sharded", "--world-size", "3"});
  const std::vector<std::string> resume{"--max-epochs", "2", "--devices", "2", "--strategy", "fsdp", "--ckpt-path"};
  auto from_file = resume, from_sharded = resume;
  from_file.push_back(last);
  from_sharded.push_back(dir / "sharded");
  const std::string expected = fit_metrics(dir / "a", from_file);
  EXPECT_NE(expected, "");
  EXPECT_EQ(fit_metrics(dir / "b", from_sharded), expected);
}

TEST(LockstepCkpt, SafetensorsNamesWhatItLeavesOutInOneNote) {
  testing::TempDir dir("lockstep_ckpt_note");
  const Trained model;
  checkpoint::CheckpointIO().save(model.full(), dir / "full.ckpt");
  const auto result = ckpt({"convert", dir / "full.ckpt", dir / "model.safetensors", "--to", "safetensors"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  size_t notes = 0;
  for (size_t at = result.err.find("note:"); at != std::string::npos; at = result.err.find("note:", at + 1)) ++notes;
  EXPECT_EQ(notes, 1u) << result.err;
  for (const std::string left : {"optimizer_states", "epoch", "global_step", "loops", "lockstep_version"}) {
    EXPECT_NE(result.err.find(left), std::string::npos) << left << " in " << result.err;
  }
  const auto weights = checkpoint::load_safetensors(dir / "model.safetensors").tensors;  // sorted by name
  ASSERT_EQ(weights.size(), model.weights().size());
  for (const auto& item : model.weights()) expect_same(item.value(), weights.at(item.key()), item.key());
  // Formats that hold everything say nothing.
  const auto sharded = ckpt({"convert", dir / "full.ckpt", dir / "s", "--to", "lockstep-sharded", "--world-size", "2"});
  ASSERT_EQ(sharded.exit_code, 0) << sharded.err;
  EXPECT_EQ(sharded.err, "");
}

TEST(LockstepCkpt, ProgressLinesGoToStderrWithTheFlag) {
  testing::TempDir dir("lockstep_ckpt_progress");
  const Trained model;
  checkpoint::CheckpointIO().save(model.full(), dir / "full.ckpt");
  const auto quiet = ckpt({"convert", dir / "full.ckpt", dir / "a", "--to", "lockstep-sharded", "--world-size", "2"});
  ASSERT_EQ(quiet.exit_code, 0) << quiet.err;
  EXPECT_EQ(quiet.err.find("lockstep ckpt: reading"), std::string::npos) << "a small input prints no progress";
  const auto loud = ckpt({"convert", dir / "full.ckpt", dir / "b", "--to", "lockstep-sharded", "--world-size", "2",
                          "--progress"});
  ASSERT_EQ(loud.exit_code, 0) << loud.err;
  EXPECT_TRUE(has_line(loud.err, "lockstep ckpt: reading " + dir / "full.ckpt")) << loud.err;
  EXPECT_TRUE(has_line(loud.err, "lockstep ckpt: wrote rank 1 of 2")) << loud.err;
  EXPECT_TRUE(has_line(loud.err, "lockstep ckpt: wrote rank 2 of 2")) << loud.err;
}

TEST(LockstepCkpt, AnExistingOutIsReplacedOnlyWithOverwrite) {
  testing::TempDir dir("lockstep_ckpt_overwrite");
  const Trained model;
  checkpoint::CheckpointIO().save(model.weights(), dir / "weights.pt");
  std::ofstream(dir / "out.pt") << "keep me";
  const auto refused = ckpt({"convert", dir / "weights.pt", dir / "out.pt", "--to", "torch"});
  EXPECT_EQ(refused.exit_code, 2);
  EXPECT_NE(refused.err.find("exists; pass --overwrite"), std::string::npos) << refused.err;
  EXPECT_EQ(testing::slurp(dir / "out.pt"), "keep me");
  convert_ok({dir / "weights.pt", dir / "out.pt", "--to", "torch", "--overwrite"});
  expect_same(c10::impl::toGenericDict(model.weights()), load_back(dir / "out.pt"), "overwritten");
  fs::create_directories(dir / "folder");
  std::ofstream(dir / "folder/mine.txt") << "mine";
  const auto folder = ckpt({"convert", dir / "weights.pt", dir / "folder", "--to", "lockstep-sharded", "--world-size",
                            "2", "--overwrite"});
  EXPECT_EQ(folder.exit_code, 2);
  EXPECT_NE(folder.err.find("is not a Lockstep sharded checkpoint"), std::string::npos) << folder.err;
  EXPECT_TRUE(fs::exists(dir / "folder/mine.txt"));
}

TEST(LockstepCkpt, BadInputExitsTwoNamingTheProblem) {
  testing::TempDir dir("lockstep_ckpt_bad");
  const Trained model;
  checkpoint::CheckpointIO().save(model.full(), dir / "full.ckpt");
  std::ofstream(dir / "junk.bin") << "not a checkpoint at all";
  {
    std::ifstream in(dir / "full.ckpt", std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(dir / "cut.ckpt", std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  }
  fs::create_directories(dir / "dcp");
  std::ofstream(dir / "dcp/.metadata") << "";  // DCP's folder is known by its .metadata
  Checkpoint fabric = checkpoint::make_checkpoint();  // no weights to be found
  fabric.insert("step", int64_t{3});
  checkpoint::CheckpointIO().save(fabric, dir / "values.ckpt");
  const std::string out = dir / "out.pt";
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"inspect", dir / "missing.ckpt"}, "does not exist"},
      {{"inspect", dir / "junk.bin"}, "is in no checkpoint format that lockstep ckpt knows"},
      {{"inspect", dir / "cut.ckpt"}, "is damaged"},
      {{"inspect", dir / "dcp"}, "its .metadata is not DCP's Metadata"},
      {{"inspect"}, "path is required"},
      {{"convert", dir / "full.ckpt", out}, "--to is required"},
      {{"convert", dir / "full.ckpt", out, "--to", "onnx"}, "--to onnx is not a format; pass one of"},
      {{"convert", dir / "full.ckpt", dir / "d", "--to", "dcp"}, "--fsdp-state-dict-type dcp"},
      {{"convert", dir / "full.ckpt", dir / "s", "--to", "lockstep-sharded"}, "needs --world-size N"},
      {{"convert", dir / "full.ckpt", out, "--to", "torch", "--world-size", "2"}, "--world-size applies to"},
      {{"convert", dir / "cut.ckpt", out, "--to", "torch"}, "is damaged"},
      {{"convert", dir / "missing.ckpt", out, "--to", "torch"}, "does not exist"},
      {{"convert", dir / "full.ckpt", dir / "full.ckpt", "--to", "torch", "--overwrite"}, "is IN itself"},
      {{"convert", dir / "full.ckpt", out, "--to", "safetensors"}, "does not end in .safetensors"},
      {{"convert", dir / "full.ckpt", dir / "o.safetensors", "--to", "torch"}, "ends in .safetensors"},
      {{"convert", dir / "values.ckpt", dir / "v.safetensors", "--to", "safetensors"}, "holds no model weights"},
  };
  for (const auto& [args, expected] : cases) {
    const auto result = ckpt(args);
    EXPECT_EQ(result.exit_code, 2) << args.back() << ": " << result.err;
    EXPECT_EQ(result.err.rfind("lockstep: error: ", 0), 0u) << result.err;
    EXPECT_NE(result.err.find(expected), std::string::npos) << expected << " in " << result.err;
    EXPECT_EQ(result.err.find("Traceback"), std::string::npos);
  }
  for (const std::string name : {"out.pt", "d", "s", "o.safetensors", "v.safetensors"}) {
    EXPECT_FALSE(fs::exists(dir / name)) << name << " was written by a refused conversion";
  }
}

// ---- Python reads what the command writes ------------------------------------------------------

// torch.load on the converted torch.save files (argv[2] "torch"), or safetensors.torch.load_file
// on the converted safetensors file ("safetensors"). Each tensor as "TAG name dtype shape hex".
const char* const kPythonReader = R"(
import sys
import torch
d, mode = sys.argv[1], sys.argv[2]
def show(tag, tensors):
    for name, t in tensors.items():
        raw = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes().hex() if t.numel() else "-"
        print(tag, name, str(t.dtype), list(t.shape), raw)
if mode == "torch":
    show("torch", torch.load(d + "/weights.pt"))
    show("full", torch.load(d + "/full.ckpt")["state_dict"])
else:
    try:
        from safetensors.torch import load_file
    except ImportError as e:
        print("skip", sys.executable, "has no safetensors package:", e)
        sys.exit(0)
    show("safetensors", load_file(d + "/model.safetensors"))
)";

std::string hex_of(const torch::Tensor& tensor) {
  if (tensor.numel() == 0) return "-";
  const auto bytes = tensor.contiguous();
  const auto* data = static_cast<const unsigned char*>(bytes.data_ptr());
  std::string out;
  static const char* digits = "0123456789abcdef";
  for (int64_t i = 0; i < bytes.numel() * static_cast<int64_t>(bytes.element_size()); ++i) {
    out += digits[data[i] >> 4];
    out += digits[data[i] & 15];
  }
  return out;
}

// What Python read of the files the command converted from `model`'s checkpoint (through a sharded
// one), by tag and name; `skip` says why nothing was read.
std::map<std::string, std::map<std::string, std::string>> python_reads(const Trained& model, const std::string& mode,
                                                                      std::string& skip) {
  testing::TempDir dir("lockstep_ckpt_python");
  checkpoint::CheckpointIO().save(model.full(), dir / "source.ckpt");
  convert_ok({dir / "source.ckpt", dir / "sharded", "--to", "lockstep-sharded", "--world-size", "2"});
  convert_ok({dir / "sharded", dir / "full.ckpt", "--to", "lockstep"});
  convert_ok({dir / "sharded", dir / "model.safetensors", "--to", "safetensors"});
  convert_ok({dir / "model.safetensors", dir / "weights.pt", "--to", "torch"});
  const auto result = testing::run_command({LOCKSTEP_TEST_PYTHON, "-c", kPythonReader, dir.path(), mode},
                                           {{"OMP_NUM_THREADS", "1"}, {"HOME", dir.path()}}, std::chrono::seconds(120));
  std::map<std::string, std::map<std::string, std::string>> read;  // tag -> name -> hex
  if (result.err.find("No module named 'torch'") != std::string::npos) skip = "the test Python has no torch";
  EXPECT_TRUE(!skip.empty() || result.exit_code == 0) << result.out << result.err;
  for (const auto& line : result.out_lines()) {
    std::istringstream words(line);
    std::string tag, name, shape, hex;
    words >> tag >> name;
    if (tag == "skip") skip = line.substr(5) + " (pip install safetensors; scripts/libtorch2-requirements.txt has it)";
    std::getline(words, shape, ']');
    words >> hex;
    if (tag != "skip") read[tag][name] = hex;
  }
  return read;
}

void expect_read_as_written(const Trained& model, const std::string& mode, const std::vector<std::string>& tags) {
  std::string skip;
  auto read = python_reads(model, mode, skip);
  if (!skip.empty()) GTEST_SKIP() << skip;
  const auto weights = model.weights();
  for (const auto& tag : tags) {
    SCOPED_TRACE(tag);
    ASSERT_EQ(read[tag].size(), weights.size());
    for (const auto& item : weights) EXPECT_EQ(read[tag][item.key()], hex_of(item.value())) << item.key();
  }
}

TEST(LockstepCkptPython, TorchLoadReadsTheConvertedFilesBitIdentical) {
  expect_read_as_written(Trained(), "torch", {"torch", "full"});
}

TEST(LockstepCkptPython, SafetensorsLoadFileReadsTheConvertedFileBitIdentical) {
  expect_read_as_written(Trained(), "safetensors", {"safetensors"});
}

// Python's torch.save(model.state_dict()) (an OrderedDict with _metadata) lists by its names, and
// comes back from a sharded checkpoint and safetensors as the same tensors, in the same order.
const char* const kPythonStateDict = R"(
import sys
import torch
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.BatchNorm1d(5), torch.nn.Linear(5, 2).double())
torch.save(m.state_dict(), sys.argv[1] + "/python.pt")
)";

TEST(LockstepCkptPython, PythonsStateDictListsAndComesBackTheSame) {
  testing::TempDir dir("lockstep_ckpt_python_sd");
  const auto python = testing::run_command({LOCKSTEP_TEST_PYTHON, "-c", kPythonStateDict, dir.path()},
                                           {{"OMP_NUM_THREADS", "1"}, {"HOME", dir.path()}}, std::chrono::seconds(120));
  if (python.err.find("No module named 'torch'") != std::string::npos) GTEST_SKIP() << "the test Python has no torch";
  ASSERT_EQ(python.exit_code, 0) << python.err;
  const auto listed = ckpt({"inspect", dir / "python.pt"});
  ASSERT_EQ(listed.exit_code, 0) << listed.err;
  EXPECT_TRUE(has_line(listed.out, dir / "python.pt: plain torch.save file")) << listed.out;
  EXPECT_TRUE(has_line(listed.out, "  0.weight ", "float32   [5, 3]")) << listed.out;
  EXPECT_TRUE(has_line(listed.out, "  2.weight ", "float64   [2, 5]")) << listed.out;
  EXPECT_TRUE(has_line(listed.out, "  1.num_batches_tracked ", "int64     []")) << listed.out;
  convert_ok({dir / "python.pt", dir / "sharded", "--to", "lockstep-sharded", "--world-size", "3"});
  convert_ok({dir / "sharded", dir / "back.pt", "--to", "torch"});
  convert_ok({dir / "back.pt", dir / "model.safetensors", "--to", "safetensors"});
  convert_ok({dir / "model.safetensors", dir / "again.pt", "--to", "torch"});
  const auto original = load_back(dir / "python.pt");
  expect_same(original, load_back(dir / "back.pt"), "python -> sharded -> torch");
  const auto again = load_back(dir / "again.pt").toGenericDict();
  for (const auto& item : original.toGenericDict()) {
    expect_same(item.value(), again.at(item.key()), "via safetensors: " + c10::str(item.key()));
  }
}

}  // namespace ckpt_command_test
}  // namespace lockstep
