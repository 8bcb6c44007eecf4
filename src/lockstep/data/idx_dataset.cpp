#include <lockstep/data/idx_dataset.h>

#include <zlib.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <system_error>

#include <torch/torch.h>

#include <lockstep/core/error.h>

namespace lockstep {
namespace data {
namespace {

namespace fs = std::filesystem;

constexpr int kUnsignedByte = 0x08;
constexpr int kImageDims = 3;
constexpr int kLabelDims = 1;
// A header declaring more than this is damaged (MNIST's training images are 47 MB).
constexpr uint64_t kMaxBytes = uint64_t{1} << 34;

std::string install_hint(const std::string& directory) {
  const std::string package = "apt-get install dataset-fashion-mnist (files in " + std::string(kFashionMnistDirectory) + ")";
  if (fs::path(directory).lexically_normal() == fs::path(kFashionMnistDirectory).lexically_normal()) {
    return "Install it with: " + package + ", or point --data-dir at a directory holding the IDX files.";
  }
  return "Point --data-dir at a directory holding the IDX files, e.g. " + std::string(kFashionMnistDirectory) +
         " after " + package + ".";
}

const char* reinstall_hint() {
  return "Replace the file: apt-get install --reinstall dataset-fashion-mnist, or download it again.";
}

std::string resolve(const std::string& directory, const std::string& base) {
  const fs::path dir(directory);
  for (const std::string& name : {base + ".gz", base}) {
    std::error_code error;
    if (fs::is_regular_file(dir / name, error)) return (dir / name).string();
  }
  const std::string what = fs::is_directory(dir) ? directory + " has neither " + base + ".gz nor " + base
                                                 : "the directory " + directory + " does not exist";
  throw UsageError("IDX data not found: " + what + ". " + install_hint(directory));
}

// gzopen reads gzip'd and plain files alike.
class IdxReader {
 public:
  explicit IdxReader(std::string path) : path_(std::move(path)), file_(gzopen(path_.c_str(), "rb")) {
    if (file_ == nullptr) {
      throw UsageError("cannot open IDX file " + path_ + " (" + std::generic_category().message(errno) +
                       "). Check that it is readable. " + reinstall_hint());
    }
    gzbuffer(file_, 1 << 17);
  }
  ~IdxReader() { gzclose(file_); }
  IdxReader(const IdxReader&) = delete;
  IdxReader& operator=(const IdxReader&) = delete;

  // Reads up to `size` bytes; fewer only at the end of the data.
  uint64_t read(void* out, uint64_t size) {
    auto* bytes = static_cast<unsigned char*>(out);
    uint64_t done = 0;
    while (done < size) {
      const unsigned chunk = static_cast<unsigned>(std::min<uint64_t>(size - done, 1u << 30));
      const int n = gzread(file_, bytes + done, chunk);
      if (n < 0) fail_stream();
      if (n == 0) break;
      done += static_cast<uint64_t>(n);
    }
    if (done < size) fail_stream_if_error();
    return done;
  }

  // Magic number (0x0000 08 ndims, big-endian) then ndims big-endian uint32 dimensions.
  std::vector<uint64_t> header(int dims, const char* kind) {
    unsigned char magic[4];
    if (read(magic, 4) < 4) bad("it is shorter than an IDX header (4 bytes)");
    const bool ok = magic[0] == 0 && magic[1] == 0 && magic[2] == kUnsignedByte && magic[3] == dims;
    if (!ok) {
      char text[96];
      std::snprintf(text, sizeof(text), "its magic number is 0x%02X%02X%02X%02X, an IDX %s file has 0x000008%02X", magic[0],
                    magic[1], magic[2], magic[3], kind, dims);
      bad(text);
    }
    std::vector<uint64_t> sizes;
    for (int i = 0; i < dims; ++i) {
      unsigned char b[4];
      if (read(b, 4) < 4) bad("it ends inside its header");
      sizes.push_back((uint64_t{b[0]} << 24) | (uint64_t{b[1]} << 16) | (uint64_t{b[2]} << 8) | uint64_t{b[3]});
    }
    return sizes;
  }

  void read_body(void* out, uint64_t size, const std::string& declared) {
    const uint64_t got = read(out, size);
    if (got < size) {
      bad("it is truncated: its header declares " + declared + " (" + std::to_string(size) + " bytes of data) but it holds " +
          std::to_string(got));
    }
    unsigned char extra;
    if (read(&extra, 1) != 0) bad("it holds more data than its header declares (" + declared + ")");
  }

  [[noreturn]] void bad(const std::string& why) const {
    throw UsageError("IDX file " + path_ + " is not valid: " + why + ". " + reinstall_hint());
  }

 private:
  [[noreturn]] void fail_stream() const {
    int code = Z_OK;
    const char* message = gzerror(file_, &code);
    if (code == Z_ERRNO) bad(std::string("reading it failed (") + std::strerror(errno) + ")");
    bad(std::string("its gzip data is damaged (") + (message ? message : "unknown zlib error") + ")");
  }
  void fail_stream_if_error() const {
    int code = Z_OK;
    gzerror(file_, &code);
    if (code != Z_OK) fail_stream();
  }

  std::string path_;
  gzFile file_;
};

torch::Tensor read_images(const std::string& path) {
  IdxReader reader(path);
  const auto dims = reader.header(kImageDims, "image");
  if (dims[1] == 0 || dims[2] == 0) reader.bad("its images are " + std::to_string(dims[1]) + "x" + std::to_string(dims[2]));
  const uint64_t image_bytes = dims[1] * dims[2];  // < 2^64: each dimension is a uint32
  if (image_bytes > kMaxBytes || dims[0] > kMaxBytes / image_bytes) {
    reader.bad("its header declares an implausible " + std::to_string(dims[0]) + " images of " + std::to_string(dims[1]) +
               "x" + std::to_string(dims[2]));
  }
  const uint64_t bytes = dims[0] * image_bytes;
  auto images = torch::empty({static_cast<int64_t>(dims[0]), static_cast<int64_t>(dims[1]), static_cast<int64_t>(dims[2])},
                             torch::kUInt8);
  reader.read_body(images.data_ptr<uint8_t>(), bytes,
                   std::to_string(dims[0]) + " images of " + std::to_string(dims[1]) + "x" + std::to_string(dims[2]));
  return images;
}

torch::Tensor read_labels(const std::string& path) {
  IdxReader reader(path);
  const uint64_t count = reader.header(kLabelDims, "label")[0];
  auto bytes = torch::empty({static_cast<int64_t>(count)}, torch::kUInt8);
  reader.read_body(bytes.data_ptr<uint8_t>(), count, std::to_string(count) + " labels");
  return bytes.to(torch::kInt64);
}

}  // namespace

IdxDataset::IdxDataset(IdxDatasetOptions options) : options_(std::move(options)) {
  const std::string prefix = options_.split() == Split::Train ? "train" : "t10k";
  const std::string images = resolve(options_.directory(), prefix + "-images-idx3-ubyte");
  const std::string labels = resolve(options_.directory(), prefix + "-labels-idx1-ubyte");
  load(images, labels);
}

IdxDataset::IdxDataset(const std::string& images_path, const std::string& labels_path, IdxDatasetOptions options)
    : options_(std::move(options)) {
  for (const auto& path : {images_path, labels_path}) {
    std::error_code error;
    if (!fs::is_regular_file(path, error)) {
      throw UsageError("IDX file " + path + " does not exist. " + install_hint(fs::path(path).parent_path().string()));
    }
  }
  load(images_path, labels_path);
}

void IdxDataset::load(const std::string& images_path, const std::string& labels_path) {
  if (options_.normalize() && !(options_.stddev() > 0)) {
    throw UsageError("IdxDataset: stddev=" + std::to_string(options_.stddev()) +
                     " cannot normalise; pass a positive standard deviation (Fashion-MNIST: 0.3530).");
  }
  images_path_ = images_path;
  labels_path_ = labels_path;
  images_ = read_images(images_path);
  labels_ = read_labels(labels_path);
  if (images_.size(0) != labels_.size(0)) {
    throw UsageError("IDX files do not match: " + images_path + " holds " + std::to_string(images_.size(0)) +
                     " images but " + labels_path + " holds " + std::to_string(labels_.size(0)) +
                     " labels. Use the image and label files of the same split.");
  }
  const float mean = static_cast<float>(options_.mean()), stddev = static_cast<float>(options_.stddev());
  for (int v = 0; v < 256; ++v) {
    const float scaled = static_cast<float>(v) / 255.0f;
    pixel_value_[v] = options_.normalize() ? (scaled - mean) / stddev : scaled;
  }
}

c10::optional<size_t> IdxDataset::size() const { return static_cast<size_t>(images_.size(0)); }

std::vector<int64_t> IdxDataset::example_shape() const {
  if (options_.flatten()) return {rows() * cols()};
  return {1, rows(), cols()};
}

void IdxDataset::fill(int64_t index, float* out) const {
  const int64_t pixels = rows() * cols();
  const uint8_t* in = images_.data_ptr<uint8_t>() + index * pixels;
  for (int64_t i = 0; i < pixels; ++i) out[i] = pixel_value_[in[i]];
}

torch::data::Example<> IdxDataset::get(size_t index) {
  if (index >= static_cast<size_t>(images_.size(0))) {
    throw UsageError("IdxDataset::get: index " + std::to_string(index) + " is past the last of its " +
                     std::to_string(images_.size(0)) + " examples; use an index in [0, size()).");
  }
  auto data = torch::empty(example_shape(), torch::kFloat32);
  fill(static_cast<int64_t>(index), data.data_ptr<float>());
  return {data, labels_[static_cast<int64_t>(index)]};
}

torch::data::Example<> IdxDataset::gather(const std::vector<int64_t>& indices) const {
  auto shape = example_shape();
  shape.insert(shape.begin(), static_cast<int64_t>(indices.size()));
  auto data = torch::empty(shape, torch::kFloat32);
  float* out = data.data_ptr<float>();
  const int64_t pixels = rows() * cols(), count = images_.size(0);
  for (size_t i = 0; i < indices.size(); ++i) {
    if (indices[i] < 0 || indices[i] >= count) {
      throw UsageError("IdxDataset::gather: index " + std::to_string(indices[i]) + " is outside [0, " +
                       std::to_string(count) + "), the examples of this dataset; use indices below size().");
    }
    fill(indices[i], out + static_cast<int64_t>(i) * pixels);
  }
  return {data, labels_.index_select(0, torch::tensor(indices, torch::kInt64))};
}

}  // namespace data
}  // namespace lockstep
