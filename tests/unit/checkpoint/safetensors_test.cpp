// safetensors (checkpoint/safetensors.h): round trips of every dtype, Python's byte layout, the
// memory map, each kind of bad file, Hugging Face's sharded index, loading into a module through
// CheckpointIO and a KeyMap, and files exchanged with Python's safetensors package.
#include <lockstep/checkpoint/checkpoint_io.h>
#include <lockstep/checkpoint/key_map.h>
#include <lockstep/checkpoint/safetensors.h>
#include <lockstep/checkpoint/state_dict.h>
#include <lockstep/core/error.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "../../support/command.h"
#include "../../support/paths.h"
#include "../../support/temp_dir.h"

namespace lockstep {
namespace checkpoint {
namespace safetensors_test {

namespace fs = std::filesystem;
using Tensors = c10::Dict<std::string, torch::Tensor>;

// The dtypes with their names in the file, in the order Python's safetensors writes them.
const std::vector<std::pair<std::string, torch::Dtype>> kDtypes = {
    {"I64", torch::kLong},   {"F64", torch::kDouble}, {"F32", torch::kFloat}, {"I32", torch::kInt},
    {"BF16", torch::kBFloat16}, {"F16", torch::kHalf}, {"I16", torch::kShort}, {"I8", torch::kChar},
    {"U8", torch::kByte},    {"BOOL", torch::kBool}};

// A tensor whose bytes follow a pattern (every bit pattern a float can hold, NaNs included);
// BOOL's are 0 and 1. Python's half of the interop test builds the same ones.
torch::Tensor pattern(torch::Dtype dtype, std::vector<int64_t> shape, int seed) {
  auto tensor = torch::empty(shape, torch::TensorOptions().dtype(dtype));
  auto* bytes = static_cast<unsigned char*>(tensor.data_ptr());
  const int64_t size = tensor.numel() * static_cast<int64_t>(tensor.element_size());
  for (int64_t i = 0; i < size; ++i) {
    bytes[i] = dtype == torch::kBool ? (i + seed) % 2 : static_cast<unsigned char>((i * 37 + seed * 11 + 5) % 256);
  }
  return tensor;
}

std::string bytes_of(const torch::Tensor& tensor) {
  const auto contiguous = tensor.contiguous();
  return std::string(static_cast<const char*>(contiguous.data_ptr()), contiguous.numel() * contiguous.element_size());
}

std::string hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char b : bytes) {
    out += digits[b >> 4];
    out += digits[b & 15];
  }
  return out;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A file of `header` (its length as given) and `data`.
std::string file_of(const std::string& header, const std::string& data, uint64_t length) {
  std::string bytes(8, '\0');
  std::memcpy(bytes.data(), &length, 8);
  return bytes + header + data;
}
std::string file_of(const std::string& header, const std::string& data) { return file_of(header, data, header.size()); }

std::string load_error(const std::string& path) {
  try {
    load_safetensors(path);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(no UsageError)";
}

void expect_identical(const Tensors& expected, const Tensors& actual) {
  ASSERT_EQ(expected.size(), actual.size());
  for (const auto& item : expected) {
    SCOPED_TRACE(item.key());
    ASSERT_TRUE(actual.contains(item.key()));
    const auto& got = actual.at(item.key());
    EXPECT_EQ(got.scalar_type(), item.value().scalar_type());
    EXPECT_EQ(got.sizes(), item.value().sizes());
    EXPECT_TRUE(bytes_of(got) == bytes_of(item.value())) << "bytes differ";
  }
}

TEST(Safetensors, EveryDtypeRoundTripsBitIdentical) {
  testing::TempDir dir("lockstep_safetensors");
  Tensors tensors;
  int seed = 0;
  for (const auto& [name, dtype] : kDtypes) {
    tensors.insert("matrix." + name, pattern(dtype, {3, 5}, ++seed));
    tensors.insert("scalar." + name, pattern(dtype, {}, ++seed));
    tensors.insert("empty." + name, pattern(dtype, {0, 4}, ++seed));
    tensors.insert("cube." + name, pattern(dtype, {2, 3, 7}, ++seed));
  }
  save_safetensors(tensors, dir / "all.safetensors", {{"format", "pt"}, {"note", "round trip"}});
  const Safetensors back = load_safetensors(dir / "all.safetensors");
  expect_identical(tensors, back.tensors);
  EXPECT_EQ(back.metadata, (std::map<std::string, std::string>{{"format", "pt"}, {"note", "round trip"}}));
  std::vector<std::string> names;
  for (const auto& item : back.tensors) names.push_back(item.key());
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end())) << "tensors come back sorted by name";
}

TEST(Safetensors, ViewsAndDeviceLayoutsAreWrittenAsTheirValues) {
  testing::TempDir dir("lockstep_safetensors");
  const auto base = torch::arange(24, torch::kFloat).reshape({4, 6});
  Tensors tensors;
  tensors.insert("transposed", base.t());
  tensors.insert("strided", base.index({torch::indexing::Slice(), torch::indexing::Slice(1, 6, 2)}));
  save_safetensors(tensors, dir / "views.safetensors");
  const auto back = load_safetensors(dir / "views.safetensors").tensors;
  EXPECT_TRUE(torch::equal(back.at("transposed"), base.t()));
  EXPECT_TRUE(torch::equal(back.at("strided"), tensors.at("strided")));
}

// The bytes Python's safetensors 0.8 writes for this dict (save_file with metadata={"format": "pt"}):
// dtypes largest first, then names; the header padded with spaces to a multiple of 8.
TEST(Safetensors, FileHasPythonsLayout) {
  testing::TempDir dir("lockstep_safetensors");
  Tensors tensors;
  tensors.insert("b", torch::zeros({3}, torch::kFloat));
  tensors.insert("a", torch::zeros({2}, torch::kChar));
  tensors.insert("c", torch::zeros({1}, torch::kDouble));
  tensors.insert("z", torch::zeros({}, torch::kBool));
  tensors.insert("e", torch::zeros({0, 3}, torch::kHalf));
  save_safetensors(tensors, dir / "layout.safetensors", {{"format", "pt"}});
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"c":{"dtype":"F64","shape":[1],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"F32","shape":[3],"data_offsets":[8,20]},"e":{"dtype":"F16","shape":[0,3],"data_offsets":[20,20]},)"
      R"("a":{"dtype":"I8","shape":[2],"data_offsets":[20,22]},"z":{"dtype":"BOOL","shape":[],"data_offsets":[22,23]}})"
      "       ";
  EXPECT_EQ(read_bytes(dir / "layout.safetensors"), file_of(header, std::string(23, '\0')));
  save_safetensors(Tensors(), dir / "empty.safetensors");
  EXPECT_EQ(read_bytes(dir / "empty.safetensors"), file_of("{}      ", ""));
}

TEST(Safetensors, TensorsAliasTheMappedFileAndWritesStayInMemory) {
  testing::TempDir dir("lockstep_safetensors");
  Tensors tensors;
  tensors.insert("a", torch::arange(4, torch::kFloat));
  tensors.insert("b", torch::arange(6, torch::kFloat));
  save_safetensors(tensors, dir / "ab.safetensors");
  const std::string before = read_bytes(dir / "ab.safetensors");
  torch::Tensor a, b;
  {
    const auto loaded = load_safetensors(dir / "ab.safetensors").tensors;
    a = loaded.at("a");
    b = loaded.at("b");
  }
  // One mapping: b's bytes follow a's (a is 16 bytes), as in the file; no copy was made.
  EXPECT_EQ(static_cast<char*>(b.data_ptr()) - static_cast<char*>(a.data_ptr()), 16);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data_ptr()) % 8, 0u);
  a.add_(100);  // copy on write: the file keeps its bytes
  EXPECT_TRUE(torch::equal(a, torch::arange(4, torch::kFloat) + 100));
  EXPECT_TRUE(torch::equal(b, torch::arange(6, torch::kFloat)));
  EXPECT_EQ(read_bytes(dir / "ab.safetensors"), before);
}

TEST(Safetensors, UnalignedDataIsCopied) {
  testing::TempDir dir("lockstep_safetensors");
  // A header of 57 bytes puts the data at byte 65: each float is read through a copy.
  std::string header = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  header.append(57 - header.size(), ' ');
  const float values[2] = {1.5f, -2.25f};
  write_bytes(dir / "odd.safetensors", file_of(header, std::string(reinterpret_cast<const char*>(values), 8)));
  const auto x = load_safetensors(dir / "odd.safetensors").tensors.at("x");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(x.data_ptr()) % 4, 0u);
  EXPECT_TRUE(torch::equal(x, torch::tensor({1.5f, -2.25f})));
}

struct BadFile {
  std::string what;
  std::string bytes;
  std::string message;  // a part of the error
};

std::string entry(const std::string& name, const std::string& dtype, const std::string& shape, const std::string& offsets) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":" + offsets + "}";
}

std::vector<BadFile> bad_files() {
  const std::string eight(8, '\1');
  return {
      {"empty", "", "truncated: 0 bytes"},
      {"shorter than the length", "abcde", "truncated: 5 bytes"},
      {"huge header length", file_of("{}", "", uint64_t{1} << 40), "over the limit of 100000000"},
      {"header past the end", file_of("{}", "", 200), "truncated: its header length is 200 bytes and only 2 follow"},
      {"header not JSON", file_of("{\"a\":", eight), "its header is not JSON"},
      {"header a list", file_of("[1,2]", ""), "not an object of tensors"},
      {"entry not an object", file_of("{\"a\":3}", ""), "entry for 'a' is not an object"},
      {"unknown dtype", file_of("{" + entry("a", "F8_E4M3", "[8]", "[0,8]") + "}", eight),
       "'a' has dtype F8_E4M3, which Lockstep does not read (it reads I64, F64, F32, I32, BF16, F16, I16, I8, U8, BOOL)"},
      {"no dtype", file_of("{\"a\":{\"shape\":[1],\"data_offsets\":[0,1]}}", "\1"), "'a' has no dtype"},
      {"negative size", file_of("{" + entry("a", "U8", "[-1]", "[0,0]") + "}", ""), "shape [-1] that is not a list of sizes"},
      {"shape overflows", file_of("{" + entry("a", "F32", "[4611686018427387904,4]", "[0,8]") + "}", eight),
       "too large for any file"},
      {"no offsets", file_of("{\"a\":{\"dtype\":\"U8\",\"shape\":[1]}}", "\1"), "'a' has no data_offsets"},
      {"offsets backwards", file_of("{" + entry("a", "U8", "[0]", "[8,0]") + "}", eight), "end before they begin"},
      {"size differs from the range", file_of("{" + entry("a", "F32", "[3]", "[0,8]") + "}", eight),
       "'a' is F32 [3], 3 elements of 4 bytes, but its data_offsets [0,8] hold 8"},
      {"empty tensor with bytes", file_of("{" + entry("a", "F32", "[0,2]", "[0,8]") + "}", eight), "'a' is F32 [0, 2], 0 elements of 4 bytes, but its data_offsets [0,8] hold 8"},
      {"overlapping ranges",
       file_of("{" + entry("a", "F32", "[2]", "[0,8]") + "," + entry("b", "F32", "[2]", "[4,12]") + "}", eight + "1234"),
       "the data of 'b' [4, 12) overlaps that of 'a', which ends at 8"},
      {"gap", file_of("{" + entry("a", "F32", "[1]", "[0,4]") + "," + entry("b", "F32", "[1]", "[8,12]") + "}", eight + "1234"),
       "bytes [4, 8) of the data belong to no tensor"},
      {"gap at the start", file_of("{" + entry("a", "F32", "[1]", "[4,8]") + "}", eight), "bytes [0, 4)"},
      {"bytes after the last tensor", file_of("{" + entry("a", "F32", "[1]", "[0,4]") + "}", eight),
       "the last 4 bytes of the data (from 4) belong to no tensor"},
      {"range past the end", file_of("{" + entry("a", "F32", "[4]", "[0,16]") + "}", eight),
       "reaches past the end of the file, whose data holds 8 bytes"},
      {"a bool that is 2", file_of("{" + entry("a", "BOOL", "[2]", "[0,2]") + "}", std::string("\1\2", 2)),
       "BOOL tensor 'a' holds the byte 2, not 0 or 1"},
      {"metadata not strings", file_of("{\"__metadata__\":{\"n\":1}}", ""), "__metadata__ 'n' is not a string"},
      {"metadata a list", file_of("{\"__metadata__\":[]}", ""), "__metadata__ is not an object"},
      {"invalid UTF-8 name", file_of("{\"\xff\":1}", ""), "its header is not JSON"},
  };
}

TEST(Safetensors, EachBadFileIsRefusedNamingTheFileAndTheProblem) {
  testing::TempDir dir("lockstep_safetensors");
  for (const auto& bad : bad_files()) {
    SCOPED_TRACE(bad.what);
    const std::string path = dir / "bad.safetensors";
    write_bytes(path, bad.bytes);
    const std::string error = load_error(path);
    EXPECT_NE(error.find("safetensors file '" + path + "' is damaged or not a safetensors file: "), std::string::npos)
        << error;
    EXPECT_NE(error.find(bad.message), std::string::npos) << error;
  }
}

TEST(Safetensors, EveryCutOfAFileIsRefused) {
  testing::TempDir dir("lockstep_safetensors");
  Tensors tensors;
  tensors.insert("w", pattern(torch::kFloat, {3, 4}, 1));
  tensors.insert("b", pattern(torch::kBool, {5}, 2));
  save_safetensors(tensors, dir / "whole.safetensors", {{"format", "pt"}});
  const std::string whole = read_bytes(dir / "whole.safetensors");
  for (std::size_t size = 0; size < whole.size(); ++size) {
    write_bytes(dir / "cut.safetensors", whole.substr(0, size));
    EXPECT_NE(load_error(dir / "cut.safetensors").find("is damaged"), std::string::npos) << "cut at " << size;
  }
}

TEST(Safetensors, MissingFileAndFolderAreRefused) {
  testing::TempDir dir("lockstep_safetensors");
  EXPECT_NE(load_error(dir / "none.safetensors").find("does not exist"), std::string::npos);
  fs::create_directory(dir / "folder.safetensors");
  EXPECT_NE(load_error(dir / "folder.safetensors").find("not a regular file"), std::string::npos);
}

TEST(Safetensors, WhatTheFormatCannotHoldIsRefusedByName) {
  testing::TempDir dir("lockstep_safetensors");
  const auto save_error = [&](const Tensors& tensors) {
    try {
      save_safetensors(tensors, dir / "out.safetensors");
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string("(no UsageError)");
  };
  Tensors complex;
  complex.insert("z", torch::zeros({2}, torch::kComplexFloat));
  EXPECT_NE(save_error(complex).find("'z' is a ComplexFloat tensor"), std::string::npos) << save_error(complex);
  Tensors reserved;
  reserved.insert("__metadata__", torch::zeros({1}));
  EXPECT_NE(save_error(reserved).find("named __metadata__"), std::string::npos);
  EXPECT_FALSE(fs::exists(dir / "out.safetensors"));
  // A Trainer checkpoint is more than tensors: CheckpointIO names what the file cannot hold.
  auto ckpt = make_checkpoint();
  ckpt.insert("w", torch::ones({2}));
  ckpt.insert("epoch", int64_t{3});
  try {
    CheckpointIO().save(ckpt, dir / "ckpt.safetensors");
    ADD_FAILURE() << "saved";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("holds tensors by name only (a state_dict), and this checkpoint also holds "
                                         "'epoch' (int)"), std::string::npos) << e.what();
  }
}

TEST(Safetensors, AFailedSaveLeavesThePreviousFile) {
  testing::TempDir dir("lockstep_safetensors");
  Tensors first;
  first.insert("w", torch::ones({4}));
  save_safetensors(first, dir / "w.safetensors");
  const std::string before = read_bytes(dir / "w.safetensors");
  Tensors failing;  // a meta tensor has no bytes: copying it to the CPU fails while the file is written
  failing.insert("a", torch::ones({2}));
  failing.insert("w", torch::empty({4}, torch::TensorOptions().device(torch::kMeta)));
  EXPECT_ANY_THROW(save_safetensors(failing, dir / "w.safetensors"));
  EXPECT_EQ(read_bytes(dir / "w.safetensors"), before);
  for (const auto& file : fs::directory_iterator(dir.path())) {
    EXPECT_EQ(file.path().filename().string().find(".tmp."), std::string::npos) << file.path();
  }
}

TEST(SafetensorsSharded, ShardsAndIndexAsTransformersWritesThemLoadAsOneModel) {
  testing::TempDir dir("lockstep_safetensors");
  Tensors tensors;
  tensors.insert("a.weight", pattern(torch::kFloat, {10}, 1));    // 40 bytes
  tensors.insert("b.weight", pattern(torch::kFloat, {10}, 2));    // 40: shard 1 holds 80
  tensors.insert("c.weight", pattern(torch::kDouble, {20}, 3));   // 160: alone, over the limit
  tensors.insert("d.bias", pattern(torch::kBFloat16, {4}, 4));    // 8
  save_sharded_safetensors(tensors, dir / "model.safetensors.index.json", 100, {{"format", "pt"}});
  for (const char* shard : {"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                            "model-00003-of-00003.safetensors"}) {
    EXPECT_TRUE(fs::exists(dir / shard)) << shard;
  }
  const auto index = nlohmann::json::parse(read_bytes(dir / "model.safetensors.index.json"));
  EXPECT_EQ(index.at("metadata").at("total_size"), 248);
  EXPECT_EQ(index.at("weight_map"), nlohmann::json({{"a.weight", "model-00001-of-00003.safetensors"},
                                                    {"b.weight", "model-00001-of-00003.safetensors"},
                                                    {"c.weight", "model-00002-of-00003.safetensors"},
                                                    {"d.bias", "model-00003-of-00003.safetensors"}}));
  const Safetensors back = load_safetensors(dir / "model.safetensors.index.json");
  expect_identical(tensors, back.tensors);
  EXPECT_EQ(back.metadata, (std::map<std::string, std::string>{{"total_size", "248"}}));
  EXPECT_EQ(load_safetensors(dir / "model-00003-of-00003.safetensors").metadata.at("format"), "pt");
  // CheckpointIO reads the index by its name, and writes one with 5 GB shards.
  EXPECT_EQ(CheckpointIO().load(dir / "model.safetensors.index.json").size(), 4u);
  auto state = make_checkpoint();
  for (const auto& item : tensors) state.insert(item.key(), item.value());
  CheckpointIO().save(state, dir / "out/net.safetensors.index.json");
  EXPECT_TRUE(fs::exists(dir / "out/net-00001-of-00001.safetensors"));
  expect_identical(tensors, load_safetensors(dir / "out/net.safetensors.index.json").tensors);
}

// Shards written apart (as each rank writes its own) get their index from their headers; a name
// in two shards is refused; CheckpointIO::remove takes the index and its shards.
TEST(SafetensorsSharded, AnIndexOfShardsWrittenApartLoadsAsOneModelAndIsRemovedWithThem) {
  testing::TempDir dir("lockstep_safetensors");
  const std::string index = dir / "model.safetensors.index.json";
  EXPECT_EQ(safetensors_shard_path(index, 2, 3), dir / "model-00002-of-00003.safetensors");
  Tensors first, second;
  first.insert("b.weight", pattern(torch::kFloat, {10}, 1));
  second.insert("a.weight", pattern(torch::kDouble, {3}, 2));
  save_safetensors(first, safetensors_shard_path(index, 1, 2));
  save_safetensors(second, safetensors_shard_path(index, 2, 2));
  write_safetensors_index(index, {safetensors_shard_path(index, 1, 2), safetensors_shard_path(index, 2, 2)});
  const auto written = nlohmann::json::parse(read_bytes(index));
  EXPECT_EQ(written.at("metadata").at("total_size"), 64);
  EXPECT_EQ(written.at("weight_map"), nlohmann::json({{"a.weight", "model-00002-of-00002.safetensors"},
                                                      {"b.weight", "model-00001-of-00002.safetensors"}}));
  Tensors both = first;
  both.insert("a.weight", second.at("a.weight"));
  expect_identical(both, load_safetensors(index).tensors);

  save_safetensors(first, dir / "again.safetensors");
  try {
    write_safetensors_index(dir / "twice.safetensors.index.json",
                            {safetensors_shard_path(index, 1, 2), dir / "again.safetensors"});
    ADD_FAILURE() << "a name in two shards was indexed";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("'b.weight' is in shard 'model-00001-of-00002.safetensors' and in "
                                         "'again.safetensors'"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(dir / "twice.safetensors.index.json"));
  EXPECT_THROW(safetensors_shard_path(dir / "model.safetensors", 1, 1), UsageError);

  CheckpointIO().remove(index);
  for (const char* gone : {"model.safetensors.index.json", "model-00001-of-00002.safetensors",
                           "model-00002-of-00002.safetensors"}) {
    EXPECT_FALSE(fs::exists(dir / gone)) << gone;
  }
  EXPECT_TRUE(fs::exists(dir / "again.safetensors"));
}

std::string index_error(const std::string& path) {
  try {
    load_safetensors(path);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(no UsageError)";
}

TEST(SafetensorsSharded, AnIndexThatLiesIsRefusedNamingTheProblem) {
  testing::TempDir dir("lockstep_safetensors");
  Tensors tensors;
  tensors.insert("a", torch::ones({2}));
  tensors.insert("b", torch::zeros({2}));
  save_safetensors(tensors, dir / "ab.safetensors");
  const std::string index = dir / "m.safetensors.index.json";
  const auto refused = [&](const std::string& json, const std::string& message) {
    write_bytes(index, json);
    const std::string error = index_error(index);
    EXPECT_NE(error.find("safetensors index '" + index + "'"), std::string::npos) << error;
    EXPECT_NE(error.find(message), std::string::npos) << error;
  };
  refused("{", "it is not JSON");
  refused("[]", "it is not a JSON object");
  refused(R"({"metadata": {}})", "no \"weight_map\" object");
  refused(R"({"weight_map": {"a": "../ab.safetensors", "b": "ab.safetensors"}})",
          "puts 'a' in \"../ab.safetensors\", which is not a file name in the index's folder");
  refused(R"({"weight_map": {"a": "ab.safetensors", "b": "gone.safetensors"}})", "its shard 'gone.safetensors' (of 'b') is not in");
  refused(R"({"weight_map": {"a": "ab.safetensors"}})", "shard 'ab.safetensors' holds 'b', which the weight_map does not put there");
  refused(R"({"weight_map": {"a": "ab.safetensors", "b": "ab.safetensors", "c": "ab.safetensors"}})",
          "puts 'c' in shard 'ab.safetensors', which does not hold it");
  refused(R"({"metadata": 3, "weight_map": {}})", "\"metadata\" is not an object");
  // A bad shard is named as itself.
  write_bytes(dir / "bad.safetensors", "xx");
  write_bytes(index, R"({"weight_map": {"a": "bad.safetensors"}})");
  EXPECT_NE(index_error(index).find("safetensors file '" + (dir / "bad.safetensors") + "' is damaged"), std::string::npos);
  EXPECT_NE(index_error(dir / "none.safetensors.index.json").find("does not exist"), std::string::npos);
  try {
    save_sharded_safetensors(tensors, dir / "model.json");
    ADD_FAILURE() << "saved";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("must end in .safetensors.index.json"), std::string::npos) << e.what();
  }
}

// Weights saved from a LightningModule's `self.model` load into the bare network through the
// same KeyMap and mismatch report as a torch.save file.
TEST(Safetensors, LoadsIntoAModuleByNameThroughCheckpointIOAndAKeyMap) {
  testing::TempDir dir("lockstep_safetensors");
  torch::manual_seed(0);
  torch::nn::Sequential source(torch::nn::Linear(4, 8), torch::nn::ReLU(), torch::nn::Linear(8, 3));
  Tensors prefixed;
  for (const auto& item : state_dict(*source)) prefixed.insert("model." + item.key(), item.value());
  save_safetensors(prefixed, dir / "lit.safetensors");
  torch::nn::Sequential target(torch::nn::Linear(4, 8), torch::nn::ReLU(), torch::nn::Linear(8, 3));
  const Checkpoint file = CheckpointIO().load(dir / "lit.safetensors");
  try {
    load_state_dict(*target, file);
    ADD_FAILURE() << "loaded";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("KeyMap().rename_prefix(\"model.\", \"\")"), std::string::npos) << e.what();
  }
  load_state_dict(*target, KeyMap::parse("model.=").apply(file));
  const auto x = torch::randn({5, 4});
  EXPECT_TRUE(torch::equal(target->forward(x), source->forward(x)));
}

// ---- Python's safetensors package ------------------------------------------------------------

// Reads Lockstep's file and prints each tensor's bytes; writes the same pattern tensors with
// save_file. safetensors.torch where the Python has torch, else safetensors.numpy (no BF16).
const char* const kPythonPeer = R"(
import sys
d = sys.argv[1]
names = ["I64", "F64", "F32", "I32", "BF16", "F16", "I16", "I8", "U8", "BOOL"]
try:
    import torch
    from safetensors.torch import load_file, save_file
    import safetensors
    kind = "torch"
    types = {"I64": torch.int64, "F64": torch.float64, "F32": torch.float32, "I32": torch.int32,
             "BF16": torch.bfloat16, "F16": torch.float16, "I16": torch.int16, "I8": torch.int8,
             "U8": torch.uint8, "BOOL": torch.bool}
    def raw(t): return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    def make(b, dt, shape):
        return torch.frombuffer(bytearray(b), dtype=types[dt]).reshape(shape) if b else torch.empty(shape, dtype=types[dt])
except ImportError:
    try:
        import numpy as np
        from safetensors.numpy import load_file, save_file
        import safetensors
    except ImportError as e:
        print("skip", sys.executable, "has no safetensors package:", e)
        sys.exit(0)
    kind = "numpy"
    names.remove("BF16")
    types = {"I64": np.int64, "F64": np.float64, "F32": np.float32, "I32": np.int32, "F16": np.float16,
             "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}
    def raw(t): return t.tobytes()
    def make(b, dt, shape): return np.frombuffer(bytes(b), dtype=types[dt]).reshape(shape)
print("kind", kind, safetensors.__version__)
for name, t in load_file(d + "/" + kind + "_lockstep.safetensors").items():
    print("tensor", name, str(t.dtype), "[" + ",".join(str(s) for s in t.shape) + "]", raw(t).hex())
def pattern(dt, shape, seed):
    n = 1
    for s in shape: n *= s
    size = {"I64": 8, "F64": 8, "F32": 4, "I32": 4, "BF16": 2, "F16": 2, "I16": 2}.get(dt, 1) * n
    return make([(i + seed) % 2 if dt == "BOOL" else (i * 37 + seed * 11 + 5) % 256 for i in range(size)], dt, shape)
out = {}
for k, dt in enumerate(names):
    out["w." + dt] = pattern(dt, (2, 3), k)
out["s"] = pattern("F64", (), 20)
out["e"] = pattern("F16", (0, 3), 21)
save_file(out, d + "/python.safetensors", metadata={"format": "pt"})
)";

// The tensors Python's peer writes, by the same recipe; numpy has no bfloat16.
Tensors peer_tensors(bool with_bf16) {
  Tensors out;
  for (std::size_t k = 0, seed = 0; k < kDtypes.size(); ++k) {
    if (kDtypes[k].first == "BF16" && !with_bf16) continue;
    out.insert("w." + kDtypes[k].first, pattern(kDtypes[k].second, {2, 3}, static_cast<int>(seed++)));
  }
  out.insert("s", pattern(torch::kDouble, {}, 20));
  out.insert("e", pattern(torch::kHalf, {0, 3}, 21));
  return out;
}

TEST(SafetensorsPython, PythonReadsLockstepsFilesBitIdenticalAndLockstepReadsPythons) {
  testing::TempDir dir("lockstep_safetensors_python");
  const Tensors with_bf16 = peer_tensors(true);
  const Tensors without_bf16 = peer_tensors(false);
  save_safetensors(with_bf16, dir / "torch_lockstep.safetensors", {{"format", "pt"}});
  save_safetensors(without_bf16, dir / "numpy_lockstep.safetensors", {{"format", "pt"}});
  const auto result = testing::run_command({LOCKSTEP_TEST_PYTHON, "-c", kPythonPeer, dir.path()},
                                           {{"OMP_NUM_THREADS", "1"}, {"HOME", dir.path()}}, std::chrono::seconds(120));
  ASSERT_EQ(result.exit_code, 0) << result.out << result.err;
  std::map<std::string, std::string> python_bytes;  // name -> hex of what Python read
  bool torch_kind = false;
  for (const auto& line : result.out_lines()) {
    std::istringstream words(line);
    std::string tag, name, dtype, shape, bytes;
    words >> tag;
    if (tag == "skip") GTEST_SKIP() << line.substr(5) << " (pip install safetensors; scripts/libtorch2-requirements.txt has it)";
    if (tag == "kind") {
      std::cout << "Python's safetensors: " << line.substr(5) << "\n";
      torch_kind = line.compare(5, 5, "torch") == 0;
    }
    if (tag == "tensor" && words >> name >> dtype >> shape) {
      words >> bytes;  // none for an empty tensor
      python_bytes[name] = bytes;
    }
  }
  const Tensors& expected = torch_kind ? with_bf16 : without_bf16;
  ASSERT_EQ(python_bytes.size(), expected.size()) << result.out;
  for (const auto& item : expected) {
    EXPECT_EQ(python_bytes[item.key()], hex(bytes_of(item.value()))) << item.key();
  }
  const Safetensors python = load_safetensors(dir / "python.safetensors");
  expect_identical(expected, python.tensors);
  EXPECT_EQ(python.metadata.at("format"), "pt");
  // The same tensors written by each are the same bytes.
  EXPECT_TRUE(read_bytes(dir / "python.safetensors") ==
              read_bytes(dir / (torch_kind ? "torch_lockstep.safetensors" : "numpy_lockstep.safetensors")));
}

}  // namespace safetensors_test
}  // namespace checkpoint
}  // namespace lockstep
