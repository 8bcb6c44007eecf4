#include <lockstep/core/error.h>
#include <lockstep/data/idx_dataset.h>

#include <gtest/gtest.h>

#include <array>
#include <filesystem>
#include <fstream>

#include <torch/torch.h>

#include "../../support/temp_dir.h"
#include "../../support/errors.h"

namespace lockstep {
namespace data {
namespace {

namespace fs = std::filesystem;

using TempDir = lockstep::testing::TempDir;

using Bytes = std::string;

void put_be32(Bytes& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out += static_cast<char>((v >> shift) & 0xFF);
}

Bytes idx_images(const std::vector<std::vector<uint8_t>>& images, uint32_t rows, uint32_t cols) {
  Bytes out;
  put_be32(out, 0x00000803);
  put_be32(out, static_cast<uint32_t>(images.size()));
  put_be32(out, rows);
  put_be32(out, cols);
  for (const auto& image : images) out.append(image.begin(), image.end());
  return out;
}

Bytes idx_labels(const std::vector<uint8_t>& labels) {
  Bytes out;
  put_be32(out, 0x00000801);
  put_be32(out, static_cast<uint32_t>(labels.size()));
  out.append(labels.begin(), labels.end());
  return out;
}

uint32_t crc32(const Bytes& data) {
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char byte : data) {
    crc ^= byte;
    for (int k = 0; k < 8; ++k) crc = (crc & 1u) ? (crc >> 1) ^ 0xEDB88320u : crc >> 1;
  }
  return ~crc;
}

// A gzip member (RFC 1952) holding `data` in stored deflate blocks (RFC 1951, BTYPE=00).
Bytes gzip(const Bytes& data) {
  Bytes out("\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff", 10);
  size_t at = 0;
  do {
    const size_t n = std::min<size_t>(data.size() - at, 65535);
    const bool last = at + n == data.size();
    out += static_cast<char>(last ? 1 : 0);
    out += static_cast<char>(n & 0xFF);
    out += static_cast<char>(n >> 8);
    out += static_cast<char>(~n & 0xFF);
    out += static_cast<char>((~n >> 8) & 0xFF);
    out.append(data, at, n);
    at += n;
  } while (at < data.size());
  const uint32_t crc = crc32(data), size = static_cast<uint32_t>(data.size());
  for (int i = 0; i < 4; ++i) out += static_cast<char>((crc >> (8 * i)) & 0xFF);
  for (int i = 0; i < 4; ++i) out += static_cast<char>((size >> (8 * i)) & 0xFF);
  return out;
}

void write(const std::string& path, const Bytes& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

// Three 2x3 images and their labels.
const std::vector<std::vector<uint8_t>> kImages{{0, 51, 102, 153, 204, 255}, {1, 2, 3, 4, 5, 6}, {255, 0, 255, 0, 255, 0}};
const std::vector<uint8_t> kLabels{7, 0, 9};

void write_split(const TempDir& dir, const std::string& prefix, bool gzipped,
                 const std::vector<std::vector<uint8_t>>& images = kImages, const std::vector<uint8_t>& labels = kLabels) {
  const std::string suffix = gzipped ? ".gz" : "";
  const Bytes image_bytes = idx_images(images, 2, 3), label_bytes = idx_labels(labels);
  write(dir / (prefix + "-images-idx3-ubyte" + suffix), gzipped ? gzip(image_bytes) : image_bytes);
  write(dir / (prefix + "-labels-idx1-ubyte" + suffix), gzipped ? gzip(label_bytes) : label_bytes);
}

float normalised(uint8_t pixel, float mean = 0.2860f, float stddev = 0.3530f) {
  return (static_cast<float>(pixel) / 255.0f - mean) / stddev;
}

class IdxFormatTest : public ::testing::TestWithParam<bool> {};

TEST_P(IdxFormatTest, ReadsExactPixelsAndLabels) {
  TempDir dir{"lockstep_idx"};
  write_split(dir, "train", /*gzipped=*/GetParam());
  IdxDataset dataset(IdxDatasetOptions(dir.path()));
  ASSERT_EQ(dataset.size().value(), 3u);
  EXPECT_EQ(dataset.rows(), 2);
  EXPECT_EQ(dataset.cols(), 3);
  EXPECT_EQ(dataset.images().scalar_type(), torch::kUInt8);
  for (int64_t i = 0; i < 3; ++i) {
    for (int64_t p = 0; p < 6; ++p) {
      EXPECT_EQ(dataset.images()[i].flatten()[p].item<int64_t>(), kImages[i][p]) << "image " << i << " pixel " << p;
    }
    const auto example = dataset.get(static_cast<size_t>(i));
    EXPECT_EQ(example.data.sizes(), (std::vector<int64_t>{1, 2, 3}));
    EXPECT_EQ(example.data.scalar_type(), torch::kFloat32);
    EXPECT_EQ(example.target.scalar_type(), torch::kInt64);
    EXPECT_EQ(example.target.dim(), 0);
    EXPECT_EQ(example.target.item<int64_t>(), kLabels[i]) << "label " << i;
    const auto flat = example.data.flatten();
    for (int64_t p = 0; p < 6; ++p) {
      EXPECT_EQ(flat[p].item<float>(), normalised(kImages[i][p])) << "image " << i << " pixel " << p;
    }
  }
  EXPECT_EQ(dataset.images_path(), dir / (std::string("train-images-idx3-ubyte") + (GetParam() ? ".gz" : "")));
}

INSTANTIATE_TEST_SUITE_P(PlainAndGzip, IdxFormatTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) { return info.param ? "gzip" : "plain"; });

TEST(IdxDatasetTest, NormalisationNumbers) {
  TempDir dir{"lockstep_idx"};
  write_split(dir, "train", false);
  IdxDataset dataset(IdxDatasetOptions(dir.path()).flatten(true));
  const auto first = dataset.get(0).data;
  EXPECT_EQ(first.sizes(), (std::vector<int64_t>{6}));
  EXPECT_NEAR(first[0].item<float>(), -0.810198, 1e-6);  // (0 - 0.2860) / 0.3530
  EXPECT_NEAR(first[5].item<float>(), 2.022663, 1e-6);   // (1 - 0.2860) / 0.3530
  // The same numbers as torchvision's ToTensor + Normalize computed with tensor operations.
  const auto reference = (dataset.images()[0].flatten().to(torch::kFloat32) / 255.0 - 0.2860) / 0.3530;
  EXPECT_TRUE(torch::allclose(first, reference, /*rtol=*/0, /*atol=*/1e-6)) << first << reference;

  IdxDataset scaled(IdxDatasetOptions(dir.path()).normalize(false).flatten(true));
  EXPECT_EQ(scaled.get(0).data[0].item<float>(), 0.0f);
  EXPECT_EQ(scaled.get(0).data[1].item<float>(), 51.0f / 255.0f);
  EXPECT_EQ(scaled.get(0).data[5].item<float>(), 1.0f);

  IdxDataset mnist(IdxDatasetOptions(dir.path()).mean(0.1307).stddev(0.3081));
  EXPECT_EQ(mnist.get(0).data.flatten()[3].item<float>(), normalised(153, 0.1307f, 0.3081f));
}

TEST(IdxDatasetTest, GatherStacksInTheGivenOrder) {
  TempDir dir{"lockstep_idx"};
  write_split(dir, "train", true);
  IdxDataset dataset(IdxDatasetOptions(dir.path()).flatten(true));
  const auto batch = dataset.gather({2, 0, 2});
  EXPECT_EQ(batch.data.sizes(), (std::vector<int64_t>{3, 6}));
  EXPECT_TRUE(torch::equal(batch.data[0], dataset.get(2).data));
  EXPECT_TRUE(torch::equal(batch.data[1], dataset.get(0).data));
  EXPECT_EQ(batch.target.sizes(), (std::vector<int64_t>{3}));
  EXPECT_EQ(batch.target[0].item<int64_t>(), 9);
  EXPECT_EQ(batch.target[1].item<int64_t>(), 7);
  const std::string gather_error = testing::error_of([&] { dataset.gather({3}); });
  EXPECT_NE(gather_error.find("index 3 is outside [0, 3)"), std::string::npos) << gather_error;
  const std::string get_error = testing::error_of([&] { dataset.get(3); });
  EXPECT_NE(get_error.find("index 3 is past the last of its 3 examples"), std::string::npos) << get_error;
}

TEST(IdxDatasetTest, WorksWithTorchDataLoader) {
  TempDir dir{"lockstep_idx"};
  write_split(dir, "train", true);
  auto loader = torch::data::make_data_loader<torch::data::samplers::SequentialSampler>(
      IdxDataset(IdxDatasetOptions(dir.path())).map(torch::data::transforms::Stack<>()), 2);
  std::vector<int64_t> sizes, labels;
  for (auto& batch : *loader) {
    sizes.push_back(batch.data.size(0));
    EXPECT_EQ(batch.data.sizes().slice(1), (std::vector<int64_t>{1, 2, 3}));
    for (int64_t i = 0; i < batch.target.size(0); ++i) labels.push_back(batch.target[i].item<int64_t>());
  }
  EXPECT_EQ(sizes, (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(labels, (std::vector<int64_t>{7, 0, 9}));
}

TEST(IdxDatasetTest, TestSplitReadsT10kFilesAndPrefersGzip) {
  TempDir dir{"lockstep_idx"};
  write_split(dir, "train", true);
  write_split(dir, "t10k", false, {{9, 9, 9, 9, 9, 9}}, {3});
  write_split(dir, "t10k", true, {{1, 1, 1, 1, 1, 1}, {2, 2, 2, 2, 2, 2}}, {4, 5});
  IdxDataset test(IdxDatasetOptions(dir.path()).split(Split::Test));
  EXPECT_EQ(test.size().value(), 2u);
  EXPECT_EQ(test.get(1).target.item<int64_t>(), 5);
  EXPECT_EQ(test.labels_path(), dir / "t10k-labels-idx1-ubyte.gz");
  IdxDataset explicit_files(dir / "t10k-images-idx3-ubyte", dir / "t10k-labels-idx1-ubyte");
  EXPECT_EQ(explicit_files.size().value(), 1u);
  EXPECT_EQ(explicit_files.get(0).target.item<int64_t>(), 3);
}

// --- errors: a UsageError that names the file and the fix ------------------------------------

void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  const std::string message = testing::error_of(fn);
  for (const auto& part : parts) EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
}

TEST(IdxDatasetErrorTest, MissingDirectoryOrFileSaysHowToInstall) {
  TempDir dir{"lockstep_idx"};
  expect_error([&] { IdxDataset(IdxDatasetOptions(dir / "absent")); },
               {dir / "absent", "does not exist", "--data-dir", "apt-get install dataset-fashion-mnist",
                "/usr/share/datasets/fashion-mnist"});
  write_split(dir, "train", true);
  expect_error([&] { IdxDataset(IdxDatasetOptions(dir.path()).split(Split::Test)); },
               {dir.path() + " has neither t10k-images-idx3-ubyte.gz nor t10k-images-idx3-ubyte",
                "apt-get install dataset-fashion-mnist"});
  expect_error([&] { IdxDataset(dir / "nope", dir / "train-labels-idx1-ubyte.gz"); }, {dir / "nope", "does not exist"});
}

TEST(IdxDatasetErrorTest, BadMagicNumber) {
  TempDir dir{"lockstep_idx"};
  write_split(dir, "train", false);
  // A labels file where images belong, and a text file.
  expect_error([&] { IdxDataset(dir / "train-labels-idx1-ubyte", dir / "train-labels-idx1-ubyte"); },
               {dir / "train-labels-idx1-ubyte", "magic number is 0x00000801", "0x00000803"});
  write(dir / "text", "hello world, not idx");
  expect_error([&] { IdxDataset(dir / "train-images-idx3-ubyte", dir / "text"); },
               {dir / "text", "magic number is 0x68656C6C", "label"});
}

TEST(IdxDatasetErrorTest, TruncatedOrOverlongData) {
  TempDir dir{"lockstep_idx"};
  write_split(dir, "train", false);
  const Bytes images = idx_images(kImages, 2, 3);
  write(dir / "train-images-idx3-ubyte", images.substr(0, images.size() - 1));
  expect_error([&] { IdxDataset(IdxDatasetOptions(dir.path())); },
               {dir / "train-images-idx3-ubyte", "truncated", "3 images of 2x3 (18 bytes of data) but it holds 17"});
  write(dir / "train-images-idx3-ubyte", images.substr(0, 10));
  expect_error([&] { IdxDataset(IdxDatasetOptions(dir.path())); }, {dir / "train-images-idx3-ubyte", "header"});
  write(dir / "train-images-idx3-ubyte", images + "x");
  expect_error([&] { IdxDataset(IdxDatasetOptions(dir.path())); }, {dir / "train-images-idx3-ubyte", "more data"});
}

TEST(IdxDatasetErrorTest, DamagedGzip) {
  TempDir dir{"lockstep_idx"};
  write_split(dir, "train", true);
  const Bytes good = gzip(idx_images(kImages, 2, 3));
  write(dir / "train-images-idx3-ubyte.gz", good.substr(0, good.size() - 6));  // trailer cut
  expect_error([&] { IdxDataset(IdxDatasetOptions(dir.path())); }, {dir / "train-images-idx3-ubyte.gz", "not valid"});
  Bytes flipped = good;
  flipped[35] ^= 0x01;  // a pixel byte (10 gzip + 5 block + 16 IDX header bytes precede them): the CRC32 in the trailer no longer matches
  write(dir / "train-images-idx3-ubyte.gz", flipped);
  expect_error([&] { IdxDataset(IdxDatasetOptions(dir.path())); },
               {dir / "train-images-idx3-ubyte.gz", "gzip data is damaged"});
}

// `cat a.gz b.gz`: gzip's members in turn, as gunzip reads them. The last member's ISIZE (6
// bytes) is too small for the first one, so the reader grows its room.
TEST(IdxDatasetGzipTest, ConcatenatedMembersReadAsOne) {
  TempDir dir{"lockstep_idx"};
  write_split(dir, "train", true);
  const Bytes images = idx_images(kImages, 2, 3);
  const size_t last = images.size() - 6;
  write(dir / "train-images-idx3-ubyte.gz", gzip(images.substr(0, last)) + gzip(images.substr(last)));
  IdxDataset dataset(IdxDatasetOptions(dir.path()));
  ASSERT_EQ(dataset.size().value(), 3u);
  for (int64_t i = 0; i < 3; ++i) {
    for (int64_t p = 0; p < 6; ++p) EXPECT_EQ(dataset.images()[i].flatten()[p].item<int64_t>(), kImages[i][p]);
  }
  write(dir / "train-images-idx3-ubyte.gz", gzip(images.substr(0, last)) + gzip(images.substr(last)).substr(0, 20));
  expect_error([&] { IdxDataset(IdxDatasetOptions(dir.path())); },
               {dir / "train-images-idx3-ubyte.gz", "gzip data is damaged (after byte"});
  write(dir / "train-images-idx3-ubyte.gz", "\x1f\x8b\x08");
  expect_error([&] { IdxDataset(IdxDatasetOptions(dir.path())); },
               {dir / "train-images-idx3-ubyte.gz", "gzip data is damaged (3 bytes"});
}

TEST(IdxDatasetErrorTest, ImageAndLabelCountsMustMatch) {
  TempDir dir{"lockstep_idx"};
  write_split(dir, "train", true, kImages, {1, 2});
  expect_error([&] { IdxDataset(IdxDatasetOptions(dir.path())); },
               {dir / "train-images-idx3-ubyte.gz", "holds 3 images", dir / "train-labels-idx1-ubyte.gz", "holds 2 labels"});
}

TEST(IdxDatasetErrorTest, ImplausibleHeader) {
  TempDir dir{"lockstep_idx"};
  write_split(dir, "train", false);
  Bytes header;
  put_be32(header, 0x00000803);
  for (int i = 0; i < 3; ++i) put_be32(header, 0xFFFFFFFFu);
  write(dir / "train-images-idx3-ubyte", header);
  expect_error([&] { IdxDataset(IdxDatasetOptions(dir.path())); }, {dir / "train-images-idx3-ubyte", "implausible"});
}

// --- the real data: Debian's dataset-fashion-mnist --------------------------------------------

TEST(IdxDatasetRealDataTest, FashionMnist) {
  if (!fs::is_directory(kFashionMnistDirectory)) {
    GTEST_SKIP() << kFashionMnistDirectory << " is absent (apt-get install dataset-fashion-mnist)";
  }
  IdxDataset train(IdxDatasetOptions().flatten(true));
  IdxDataset test(IdxDatasetOptions().split(Split::Test));
  ASSERT_EQ(train.size().value(), 60000u);
  ASSERT_EQ(test.size().value(), 10000u);
  EXPECT_EQ(train.rows(), 28);
  EXPECT_EQ(train.cols(), 28);
  EXPECT_EQ(train.labels()[0].item<int64_t>(), 9);  // an ankle boot
  EXPECT_EQ(test.labels()[0].item<int64_t>(), 9);
  const auto histogram = torch::bincount(train.labels());
  ASSERT_EQ(histogram.size(0), 10);
  for (int64_t c = 0; c < 10; ++c) EXPECT_EQ(histogram[c].item<int64_t>(), 6000) << "class " << c;
  EXPECT_EQ(torch::bincount(test.labels())[3].item<int64_t>(), 1000);
  // The default mean and stddev are Fashion-MNIST's own, so normalised pixels have mean ~0, std ~1.
  const auto pixels = train.images().to(torch::kFloat32) / 255.0;
  EXPECT_NEAR(pixels.mean().item<double>(), 0.2860, 5e-4);
  EXPECT_NEAR(pixels.std().item<double>(), 0.3530, 5e-4);
  std::vector<int64_t> every_sixth;
  for (int64_t i = 0; i < 60000; i += 6) every_sixth.push_back(i);
  const auto data = train.gather(every_sixth).data;
  EXPECT_EQ(data.sizes(), (std::vector<int64_t>{10000, 784}));
  EXPECT_NEAR(data.mean().item<double>(), 0.0, 0.01);
  EXPECT_NEAR(data.std().item<double>(), 1.0, 0.01);
  EXPECT_EQ(test.get(0).data.sizes(), (std::vector<int64_t>{1, 28, 28}));
}

}  // namespace
}  // namespace data
}  // namespace lockstep
