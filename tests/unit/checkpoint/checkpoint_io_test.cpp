#include <lockstep/checkpoint/checkpoint_io.h>
#include <lockstep/checkpoint/optimizer_state.h>
#include <lockstep/checkpoint/state_dict.h>
#include <lockstep/core/error.h>

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <system_error>

#include <torch/torch.h>

#include "../../support/command.h"

#include "../../support/paths.h"
#include "../../support/temp_dir.h"

namespace lockstep {
namespace checkpoint {
namespace {

namespace fs = std::filesystem;

using TempDir = lockstep::testing::TempDir;

std::vector<char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::vector<std::string> temp_files(const std::string& dir) {
  std::vector<std::string> found;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().filename().string().find(".tmp.") != std::string::npos) found.push_back(entry.path().string());
  }
  return found;
}

struct Mlp : torch::nn::Module {
  Mlp()
      : fc1(register_module("fc1", torch::nn::Linear(784, 512))),
        fc2(register_module("fc2", torch::nn::Linear(512, 256))),
        fc3(register_module("fc3", torch::nn::Linear(256, 10))) {}
  torch::Tensor forward(torch::Tensor x) { return fc3(torch::relu(fc2(torch::relu(fc1(x))))); }
  torch::nn::Linear fc1, fc2, fc3;
};

struct SmallNet : torch::nn::Module {
  SmallNet()
      : fc(register_module("fc", torch::nn::Linear(6, 4))), bn(register_module("bn", torch::nn::BatchNorm1d(4))) {}
  torch::Tensor forward(torch::Tensor x) { return bn(fc(x)); }
  torch::nn::Linear fc;
  torch::nn::BatchNorm1d bn;
};

template <typename Model>
void train_steps(Model& model, torch::optim::Optimizer& optimizer, int steps, int64_t inputs) {
  for (int i = 0; i < steps; ++i) {
    optimizer.zero_grad();
    model.forward(torch::randn({8, inputs})).pow(2).mean().backward();
    optimizer.step();
  }
}

Checkpoint sample_checkpoint(SmallNet& net, torch::optim::SGD& sgd, torch::optim::Adam& adam) {
  auto ckpt = make_checkpoint();
  ckpt.insert("state_dict", state_dict(net));
  c10::impl::GenericList optimizers(c10::AnyType::get());
  optimizers.push_back(optimizer_state_dict(sgd));
  optimizers.push_back(optimizer_state_dict(adam));
  ckpt.insert("optimizer_states", optimizers);
  ckpt.insert("epoch", int64_t{3});
  ckpt.insert("global_step", int64_t{1234567890123});
  ckpt.insert("best_score", 0.1 + 0.2);
  ckpt.insert("monitor", std::string("val_loss"));
  ckpt.insert("finished", false);
  ckpt.insert("nothing", c10::IValue());
  ckpt.insert("milestones", std::vector<int64_t>{2, 5, 9});
  return ckpt;
}

// Tensors equal bit for bit (dtype, shape and bytes), everything else equal as IValues.
void expect_same(const c10::IValue& a, const c10::IValue& b, const std::string& where) {
  if (a.isTensor()) {
    ASSERT_TRUE(b.isTensor()) << where;
    EXPECT_EQ(a.toTensor().scalar_type(), b.toTensor().scalar_type()) << where;
    EXPECT_TRUE(torch::equal(a.toTensor(), b.toTensor())) << where;
  } else if (a.isGenericDict()) {
    ASSERT_TRUE(b.isGenericDict()) << where;
    ASSERT_EQ(a.toGenericDict().size(), b.toGenericDict().size()) << where;
    for (const auto& entry : a.toGenericDict()) {
      ASSERT_TRUE(b.toGenericDict().contains(entry.key())) << where << "." << entry.key();
      std::ostringstream key;
      key << entry.key();
      expect_same(entry.value(), b.toGenericDict().at(entry.key()), where + "." + key.str());
    }
  } else if (a.isList()) {
    ASSERT_TRUE(b.isList()) << where;
    ASSERT_EQ(a.toListRef().size(), b.toListRef().size()) << where;
    for (size_t i = 0; i < a.toListRef().size(); ++i) {
      expect_same(a.toListRef()[i], b.toListRef()[i], where + "[" + std::to_string(i) + "]");
    }
  } else if (a.isTuple()) {
    ASSERT_TRUE(b.isTuple()) << where;
    const auto& x = a.toTupleRef().elements();
    const auto& y = b.toTupleRef().elements();
    ASSERT_EQ(x.size(), y.size()) << where;
    for (size_t i = 0; i < x.size(); ++i) expect_same(x[i], y[i], where + "(" + std::to_string(i) + ")");
  } else {
    EXPECT_EQ(a, b) << where << ": " << a << " vs " << b;
  }
}

TEST(CheckpointIOTest, RoundTripIsBitExact) {
  torch::manual_seed(0);
  SmallNet net;
  torch::optim::SGD sgd(net.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::Adam adam(net.parameters(), torch::optim::AdamOptions(1e-3));
  train_steps(net, sgd, 2, 6);
  train_steps(net, adam, 3, 6);
  const auto ckpt = sample_checkpoint(net, sgd, adam);
  TempDir dir{"lockstep_ckpt"};
  const std::string path = dir / "sub/dir/epoch=3.ckpt";  // parent directories are created
  CheckpointIO io;
  io.save(ckpt, path);
  const auto back = io.load(path);
  expect_same(ckpt, back, "ckpt");
  EXPECT_EQ(back.at("global_step").toInt(), 1234567890123);
  EXPECT_EQ(back.at("best_score").toDouble(), 0.1 + 0.2);
  EXPECT_EQ(back.at("monitor").toStringRef(), "val_loss");
  EXPECT_TRUE(back.at("nothing").isNone());
  EXPECT_EQ(back.at("state_dict").toGenericDict().at("bn.num_batches_tracked").toTensor().item<int64_t>(), 5);
  EXPECT_TRUE(temp_files(dir / "sub/dir").empty());
}

TEST(CheckpointIOTest, SaveReplacesAnExistingFile) {
  TempDir dir{"lockstep_ckpt"};
  CheckpointIO io;
  auto first = make_checkpoint();
  first.insert("epoch", int64_t{1});
  io.save(first, dir / "last.ckpt");
  auto second = make_checkpoint();
  second.insert("epoch", int64_t{2});
  io.save(second, dir / "last.ckpt");
  EXPECT_EQ(io.load(dir / "last.ckpt").at("epoch").toInt(), 2);
  EXPECT_TRUE(temp_files(dir.path()).empty());
}

TEST(CheckpointIOTest, SaveRejectsAValueThatIsNotADict) {
  TempDir dir{"lockstep_ckpt"};
  EXPECT_THROW(CheckpointIO().save(torch::ones({2}), dir / "x.ckpt"), UsageError);
  EXPECT_FALSE(fs::exists(dir / "x.ckpt"));
}

// A write that fails part way (here: the file size limit, as a full disk would) keeps the old
// checkpoint and leaves no temporary file.
TEST(CheckpointIOTest, FailedWriteKeepsThePreviousFile) {
  TempDir dir{"lockstep_ckpt"};
  CheckpointIO io;
  auto old_ckpt = make_checkpoint();
  old_ckpt.insert("epoch", int64_t{7});
  io.save(old_ckpt, dir / "model.ckpt");
  const auto old_bytes = read_bytes(dir / "model.ckpt");

  auto big = make_checkpoint();
  big.insert("weights", torch::randn({64, 1024}));  // 256 KiB
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  const auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  rlimit limited = saved;
  limited.rlim_cur = 64 * 1024;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limited), 0);
  std::string message;
  try {
    io.save(big, dir / "model.ckpt");
  } catch (const IoError& e) {
    message = e.what();
    EXPECT_EQ(e.path(), dir / "model.ckpt");
    EXPECT_EQ(e.kind(), ErrorKind::io);
  }
  ::setrlimit(RLIMIT_FSIZE, &saved);
  ::signal(SIGXFSZ, old_handler);

  EXPECT_NE(message.find(dir / "model.ckpt"), std::string::npos) << message;
  EXPECT_NE(message.find("unchanged"), std::string::npos) << message;
  EXPECT_EQ(read_bytes(dir / "model.ckpt"), old_bytes);
  EXPECT_EQ(io.load(dir / "model.ckpt").at("epoch").toInt(), 7);
  EXPECT_TRUE(temp_files(dir.path()).empty());
}

TEST(CheckpointIOTest, FailedRenameLeavesNoTemporaryFile) {
  TempDir dir{"lockstep_ckpt"};
  fs::create_directories(dir / "taken.ckpt/inside");  // a non-empty directory cannot be renamed over
  auto ckpt = make_checkpoint();
  ckpt.insert("epoch", int64_t{1});
  EXPECT_THROW(CheckpointIO().save(ckpt, dir / "taken.ckpt"), IoError);
  EXPECT_TRUE(fs::is_directory(dir / "taken.ckpt/inside"));
  EXPECT_TRUE(temp_files(dir.path()).empty());
}

// In a shared directory someone plants a symlink where the temporary file used to go
// (<path>.tmp.<pid>): the save must not write through it.
TEST(CheckpointIOTest, APlantedSymlinkIsNeverWrittenThrough) {
  TempDir dir{"lockstep_ckpt"};
  std::ofstream(dir / "victim") << "precious";
  fs::create_symlink(dir / "victim", dir / ("model.ckpt.tmp." + std::to_string(::getpid())));
  auto ckpt = make_checkpoint();
  ckpt.insert("epoch", int64_t{3});
  CheckpointIO().save(ckpt, dir / "model.ckpt");
  std::ifstream victim(dir / "victim");
  std::string text((std::istreambuf_iterator<char>(victim)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "precious");
  EXPECT_EQ(CheckpointIO().load(dir / "model.ckpt").at("epoch").toInt(), 3);
  EXPECT_TRUE(fs::is_symlink(dir / ("model.ckpt.tmp." + std::to_string(::getpid())))) << "not ours to remove";
  EXPECT_EQ(fs::status(dir / "model.ckpt").permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read | fs::perms::others_read);
}

TEST(CheckpointIOTest, UnwritableDirectoryIsAnErrorNamingThePath) {
  TempDir dir{"lockstep_ckpt"};
  std::ofstream(dir / "file") << "x";
  auto ckpt = make_checkpoint();
  ckpt.insert("epoch", int64_t{1});
  try {
    CheckpointIO().save(ckpt, dir / "file/sub/last.ckpt");  // a parent is a regular file
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(dir / "file/sub/last.ckpt"), std::string::npos) << e.what();
    EXPECT_TRUE(e.code()) << e.what();
    EXPECT_NE(std::string(e.what()).find(e.code().message()), std::string::npos) << e.what();
  }
  if (::geteuid() != 0) {  // root writes through permissions
    fs::create_directories(dir / "locked");
    fs::permissions(dir / "locked", fs::perms::owner_read | fs::perms::owner_exec);
    EXPECT_THROW(CheckpointIO().save(ckpt, dir / "locked/last.ckpt"), IoError);
  }
}

std::string load_error(const std::string& path) {
  try {
    CheckpointIO().load(path);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(no UsageError)";
}

void expect_load_error(const std::string& path, const std::string& expected) {
  const std::string message = load_error(path);
  EXPECT_NE(message.find("'" + path + "'"), std::string::npos) << message;
  EXPECT_NE(message.find(expected), std::string::npos) << "expected '" << expected << "' in: " << message;
  EXPECT_NE(message.find("--ckpt-path"), std::string::npos) << message;
}

TEST(CheckpointIOTest, MissingFileOrDirectoryIsAUsageError) {
  TempDir dir{"lockstep_ckpt"};
  expect_load_error(dir / "nope.ckpt", "does not exist");
  expect_load_error(dir.path(), "is a directory");
}

TEST(CheckpointIOTest, TruncatedFileIsAUsageError) {
  TempDir dir{"lockstep_ckpt"};
  auto ckpt = make_checkpoint();
  ckpt.insert("weights", torch::randn({100}));
  ckpt.insert("epoch", int64_t{1});
  CheckpointIO().save(ckpt, dir / "good.ckpt");
  const auto bytes = read_bytes(dir / "good.ckpt");
  for (size_t keep : {size_t{0}, size_t{3}, size_t{40}, bytes.size() / 2, bytes.size() - 1}) {
    SCOPED_TRACE("kept " + std::to_string(keep) + " of " + std::to_string(bytes.size()) + " bytes");
    write_bytes(dir / "cut.ckpt", std::vector<char>(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(keep)));
    const std::string message = load_error(dir / "cut.ckpt");
    EXPECT_NE(message.find("'" + dir / "cut.ckpt" + "'"), std::string::npos) << message;
    EXPECT_TRUE(message.find("damaged") != std::string::npos || message.find("not a Lockstep checkpoint") != std::string::npos)
        << message;
  }
}

TEST(CheckpointIOTest, FlippedByteInTensorDataIsDetected) {
  TempDir dir{"lockstep_ckpt"};
  auto ckpt = make_checkpoint();
  ckpt.insert("weights", torch::full({16}, 1234.5f));
  CheckpointIO().save(ckpt, dir / "good.ckpt");
  auto bytes = read_bytes(dir / "good.ckpt");
  const float marker = 1234.5f;
  const std::string pattern(reinterpret_cast<const char*>(&marker), sizeof marker);
  const auto at = std::string(bytes.begin(), bytes.end()).find(pattern);
  ASSERT_NE(at, std::string::npos);
  bytes[at + 1] ^= 0x10;
  write_bytes(dir / "flipped.ckpt", bytes);
  expect_load_error(dir / "flipped.ckpt", "CRC32");
}

// A crafted archive whose zip64 extra field claims 65535 bytes in an extra area of 4: its three
// 8-byte values would be read from past the entry, the last two bytes past the end of the file.
TEST(CheckpointIOTest, AZip64FieldLongerThanItsExtraAreaIsDamage) {
  std::vector<char> zip;
  auto put = [&](uint64_t value, int width) {
    for (int i = 0; i < width; ++i) zip.push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
  };
  const std::string name = "data.pkl";
  put(0x04034b50, 4);  // local header
  put(20, 2), put(0, 2), put(0, 2), put(0, 2), put(0, 2), put(0, 4), put(1, 4), put(1, 4);
  put(name.size(), 2), put(0, 2);
  zip.insert(zip.end(), name.begin(), name.end());
  zip.push_back('x');
  const uint64_t directory = zip.size();
  put(0x02014b50, 4);  // central directory entry: every 32-bit field says "see zip64"
  put(20, 2), put(20, 2), put(0, 2), put(0, 2), put(0, 2), put(0, 2), put(0, 4);
  put(0xFFFFFFFF, 4), put(0xFFFFFFFF, 4);
  put(name.size(), 2), put(4, 2), put(0, 2), put(0, 2), put(0, 2), put(0, 4), put(0xFFFFFFFF, 4);
  zip.insert(zip.end(), name.begin(), name.end());
  put(0x0001, 2), put(0xFFFF, 2);  // the zip64 field, claiming 65535 bytes
  const uint64_t directory_size = zip.size() - directory;
  put(0x06054b50, 4);  // end of central directory
  put(0, 2), put(0, 2), put(1, 2), put(1, 2), put(directory_size, 4), put(directory, 4), put(0, 2);
  TempDir dir{"lockstep_ckpt"};
  write_bytes(dir / "crafted.ckpt", zip);
  expect_load_error(dir / "crafted.ckpt", "record data.pkl has a damaged zip64 field");
}

TEST(CheckpointIOTest, OtherFilesAreNotCheckpoints) {
  TempDir dir{"lockstep_ckpt"};
  std::ofstream(dir / "notes.txt") << "epoch=3\n";
  expect_load_error(dir / "notes.txt", "not a Lockstep checkpoint");
  write_bytes(dir / "empty.ckpt", {});
  expect_load_error(dir / "empty.ckpt", "empty");
  write_bytes(dir / "legacy.pt", {'\x80', '\x02', '\x8a', '\x0a', 'l', '\xfc'});
  expect_load_error(dir / "legacy.pt", "legacy format");
  const auto tensor_file = torch::pickle_save(torch::ones({3}));  // a valid archive, not a dict
  write_bytes(dir / "tensor.pt", tensor_file);
  expect_load_error(dir / "tensor.pt", "not a dict");
}

TEST(CheckpointIOTest, RequireKeysNamesWhatIsMissing) {
  auto ckpt = make_checkpoint();
  ckpt.insert("epoch", int64_t{1});
  EXPECT_NO_THROW(require_keys(ckpt, {"epoch"}, "a.ckpt"));
  try {
    require_keys(ckpt, {"state_dict", "epoch", "global_step"}, "a.ckpt");
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("'a.ckpt'"), std::string::npos) << message;
    EXPECT_NE(message.find("\"state_dict\", \"global_step\""), std::string::npos) << message;
    EXPECT_NE(message.find("it has \"epoch\""), std::string::npos) << message;
  }
}

TEST(CheckpointIOTest, RemoveDeletesAndIgnoresMissingFiles) {
  TempDir dir{"lockstep_ckpt"};
  auto ckpt = make_checkpoint();
  CheckpointIO().save(ckpt, dir / "a.ckpt");
  CheckpointIO().remove(dir / "a.ckpt");
  EXPECT_FALSE(fs::exists(dir / "a.ckpt"));
  EXPECT_NO_THROW(CheckpointIO().remove(dir / "a.ckpt"));
}

// zlib's CRC-32 (IEEE), the checksum Python prints with zlib.crc32, chained over tensors.
uint32_t crc32(const void* data, size_t size, uint32_t crc) {
  static const auto table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1) ? 0xEDB88320u : 0u);
      t[i] = c;
    }
    return t;
  }();
  crc = ~crc;
  const auto* bytes = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < size; ++i) crc = table[(crc ^ bytes[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

const char* const kPythonReader = R"(
import sys, zlib, torch, torch.nn as nn
class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 512)
        self.fc2 = nn.Linear(512, 256)
        self.fc3 = nn.Linear(256, 10)
    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))
ckpt = torch.load(sys.argv[1])
model = Mlp()
model.load_state_dict(ckpt["state_dict"], strict=True)
adam = torch.optim.Adam(model.parameters())
adam.load_state_dict(ckpt["optimizer_states"][0])
crc = 0
for name, tensor in ckpt["state_dict"].items():
    crc = zlib.crc32(tensor.contiguous().numpy().tobytes(), crc)
x = torch.linspace(-1, 1, 2 * 784).reshape(2, 784)
print("keys", ",".join(ckpt["state_dict"].keys()))
print("epoch", ckpt["epoch"], "global_step", ckpt["global_step"])
print("crc", crc)
print("output", repr(float(model(x).double().sum())))
print("adam_step", int(adam.state_dict()["state"][0]["step"]), "lr", adam.param_groups[0]["lr"])
# No torch.jit._pickle globals: the restricted unpickler accepts it (1.13's rejects any float).
safe = torch.load(sys.argv[2], weights_only=True)
print("weights_only", ",".join(safe.keys()), safe["milestones"], safe["name"], safe["finished"], safe["nothing"],
      int(safe["state_dict"]["fc3.bias"].numel()))
torch.save({"weights": torch.ones(2)}, sys.argv[3])
)";

TEST(CheckpointIOTest, PythonTorchLoadReadsTheCheckpoint) {
  if (!fs::exists(LOCKSTEP_TEST_PYTHON)) GTEST_SKIP() << LOCKSTEP_TEST_PYTHON << " is not installed";
  torch::manual_seed(42);
  Mlp model;
  torch::optim::Adam adam(model.parameters(), torch::optim::AdamOptions(0.002));
  train_steps(model, adam, 2, 784);
  auto ckpt = make_checkpoint();
  ckpt.insert("state_dict", state_dict(model));
  c10::impl::GenericList optimizers(c10::AnyType::get());
  optimizers.push_back(optimizer_state_dict(adam));
  ckpt.insert("optimizer_states", optimizers);
  ckpt.insert("epoch", int64_t{4});
  ckpt.insert("global_step", int64_t{100});
  TempDir dir{"lockstep_ckpt"};
  CheckpointIO().save(ckpt, dir / "mlp.ckpt");
  auto no_floats = make_checkpoint();
  no_floats.insert("state_dict", state_dict(model));
  no_floats.insert("epoch", int64_t{4});
  no_floats.insert("milestones", std::vector<int64_t>{2, 5});
  no_floats.insert("name", std::string("mlp"));
  no_floats.insert("finished", true);
  no_floats.insert("nothing", c10::IValue());
  CheckpointIO().save(no_floats, dir / "no_floats.ckpt");

  const auto result = testing::run_command({LOCKSTEP_TEST_PYTHON, "-c", kPythonReader, dir / "mlp.ckpt", dir / "no_floats.ckpt",
                                            dir / "python.pt"},
                                           {{"OMP_NUM_THREADS", "1"}, {"HOME", dir.path()}}, std::chrono::seconds(60));
  if (result.err.find("No module named 'torch'") != std::string::npos) {
    GTEST_SKIP() << LOCKSTEP_TEST_PYTHON << " has no torch (apt-get install python3-torch)";
  }
  ASSERT_EQ(result.exit_code, 0) << result.out << result.err;
  std::map<std::string, std::string> lines;
  for (const auto& line : result.out_lines()) lines[line.substr(0, line.find(' '))] = line.substr(line.find(' ') + 1);

  EXPECT_EQ(lines["keys"], "fc1.weight,fc1.bias,fc2.weight,fc2.bias,fc3.weight,fc3.bias");
  EXPECT_EQ(lines["epoch"], "4 global_step 100");
  uint32_t crc = 0;
  for (const auto& entry : state_dict(model)) {
    const auto t = entry.value().contiguous();
    crc = crc32(t.data_ptr(), t.numel() * t.element_size(), crc);
  }
  EXPECT_EQ(lines["crc"], std::to_string(crc)) << "the tensors Python read differ from the saved ones";
  const auto x = torch::linspace(-1, 1, 2 * 784).reshape({2, 784});
  const double expected = model.forward(x).to(torch::kFloat64).sum().item<double>();
  EXPECT_NEAR(std::stod(lines["output"]), expected, 1e-4) << "the Python model computes something else";
  EXPECT_EQ(lines["adam_step"], "2 lr 0.002");
  EXPECT_EQ(lines["weights_only"], "state_dict,epoch,milestones,name,finished,nothing [2, 5] mlp True None 10");
  // What Python's torch.save writes loads on both LibTorch lines (torch_file_test.cpp has more).
  const auto python = CheckpointIO().load(dir / "python.pt");
  EXPECT_TRUE(python.at("weights").toTensor().equal(torch::ones(2)));
}

}  // namespace
}  // namespace checkpoint
}  // namespace lockstep
