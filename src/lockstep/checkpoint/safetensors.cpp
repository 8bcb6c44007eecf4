#include <lockstep/checkpoint/safetensors.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <memory>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <lockstep/core/error.h>

#include "atomic_file.h"
#include "safetensors_index.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors stores little-endian bytes; this reader and writer copy them as the host holds them"
#endif

namespace lockstep {
namespace checkpoint {
namespace {

using nlohmann::json;

// Python's safetensors refuses a longer header too (MAX_HEADER_SIZE).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct Dtype {
  const char* name;
  at::ScalarType type;
  uint64_t size;
};

// In the order Python's safetensors writes them (its Dtype enum, largest first), so that with an
// 8-byte aligned start every tensor is aligned to its element size.
constexpr std::array<Dtype, 10> kDtypes = {{{"I64", at::kLong, 8},
                                            {"F64", at::kDouble, 8},
                                            {"F32", at::kFloat, 4},
                                            {"I32", at::kInt, 4},
                                            {"BF16", at::kBFloat16, 2},
                                            {"F16", at::kHalf, 2},
                                            {"I16", at::kShort, 2},
                                            {"I8", at::kChar, 1},
                                            {"U8", at::kByte, 1},
                                            {"BOOL", at::kBool, 1}}};

std::string dtype_names() {
  std::string names;
  for (const auto& dtype : kDtypes) names += (names.empty() ? "" : ", ") + std::string(dtype.name);
  return names;
}

const Dtype* dtype_named(const std::string& name) {
  for (const auto& dtype : kDtypes) {
    if (name == dtype.name) return &dtype;
  }
  return nullptr;
}

const Dtype* dtype_of(at::ScalarType type) {
  for (const auto& dtype : kDtypes) {
    if (type == dtype.type) return &dtype;
  }
  return nullptr;
}

bool has_ending(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

[[noreturn]] void bad_file(const std::string& path, const std::string& problem) {
  throw UsageError("safetensors file '" + path + "' is damaged or not a safetensors file: " + problem +
                   ". It cannot be loaded: write it again (Python: safetensors.torch.save_file(model.state_dict(), "
                   "path)), or pass another file.");
}

// The file mapped copy-on-write: its tensors may be changed without changing the file. Unmapped
// when the last tensor that aliases it is freed.
class Mapping {
 public:
  Mapping(char* data, std::size_t size) : data_(data), size_(size) {}
  ~Mapping() { ::munmap(data_, size_); }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  char* data() const { return data_; }
  std::size_t size() const { return size_; }

 private:
  char* data_;
  std::size_t size_;
};

std::shared_ptr<Mapping> map_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT) {
    throw UsageError("safetensors file '" + path + "' does not exist. Pass the path of a .safetensors file, or of a "
                     "sharded model's .safetensors.index.json.");
  }
  if (fd < 0) {
    throw UsageError("safetensors file '" + path + "' cannot be opened (" + std::generic_category().message(errno) +
                     "). Check its permissions, or pass another file.");
  }
  struct stat info {};
  const bool is_file = ::fstat(fd, &info) == 0 && S_ISREG(info.st_mode);
  const auto size = static_cast<std::size_t>(info.st_size);
  void* data = is_file && size >= 8 ? ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0) : MAP_FAILED;
  const int error = errno;
  ::close(fd);
  if (!is_file) bad_file(path, "it is not a regular file (a directory?)");
  if (size < 8) bad_file(path, "it is truncated: " + std::to_string(size) + " bytes, fewer than the 8 of the header length");
  if (data == MAP_FAILED) {
    throw UsageError("safetensors file '" + path + "' cannot be mapped into memory (" +
                     std::generic_category().message(error) + "). Check the file system, or copy the file to a local disk.");
  }
  return std::make_shared<Mapping>(static_cast<char*>(data), size);
}

// One tensor as the header describes it; `begin` and `end` count from the start of the data.
struct TensorEntry {
  std::string name;
  const Dtype* dtype = nullptr;
  std::vector<int64_t> shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

std::string dims_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// "" when `shape` is a list of sizes whose product (zeros aside) fits LibTorch's int64 strides;
// `elements` is the tensor's number of elements.
std::string read_shape(const std::string& name, const json& shape, TensorEntry& entry, uint64_t& elements) {
  if (!shape.is_array()) return "'" + name + "' has no shape list";
  uint64_t nonzero = 1;
  bool empty = false;
  for (const auto& dim : shape) {
    if (!dim.is_number_unsigned() || dim.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      return "'" + name + "' has a shape " + shape.dump() + " that is not a list of sizes";
    }
    const uint64_t size = dim.get<uint64_t>();
    entry.shape.push_back(static_cast<int64_t>(size));
    empty = empty || size == 0;
    if (__builtin_mul_overflow(nonzero, std::max<uint64_t>(size, 1), &nonzero) || nonzero > static_cast<uint64_t>(INT64_MAX)) {
      return "'" + name + "' has a shape " + shape.dump() + " too large for any file";
    }
  }
  elements = empty ? 0 : nonzero;
  return "";
}

// "" when `info` describes a tensor as Python's safetensors writes it; else what is wrong.
std::string read_tensor_entry(const std::string& name, const json& info, TensorEntry& entry) {
  entry.name = name;
  if (!info.is_object()) return "the header's entry for '" + name + "' is not an object";
  const auto dtype = info.find("dtype");
  if (dtype == info.end() || !dtype->is_string()) return "'" + name + "' has no dtype string";
  entry.dtype = dtype_named(dtype->get<std::string>());
  if (!entry.dtype) {
    return "'" + name + "' has dtype " + dtype->get<std::string>() + ", which Lockstep does not read (it reads " +
           dtype_names() + ")";
  }
  uint64_t elements = 0;
  const auto shape = info.find("shape");
  if (auto problem = read_shape(name, shape == info.end() ? json() : *shape, entry, elements); !problem.empty()) {
    return problem;
  }
  const auto offsets = info.find("data_offsets");
  if (offsets == info.end() || !offsets->is_array() || offsets->size() != 2 || !(*offsets)[0].is_number_unsigned() ||
      !(*offsets)[1].is_number_unsigned()) {
    return "'" + name + "' has no data_offsets [begin, end]";
  }
  entry.begin = (*offsets)[0].get<uint64_t>();
  entry.end = (*offsets)[1].get<uint64_t>();
  if (entry.end < entry.begin) return "'" + name + "' has data_offsets " + offsets->dump() + " that end before they begin";
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(elements, entry.dtype->size, &bytes) || bytes != entry.end - entry.begin) {
    return "'" + name + "' is " + entry.dtype->name + " " + dims_text(entry.shape) + ", " + std::to_string(elements) +
           " elements of " + std::to_string(entry.dtype->size) + " bytes, but its data_offsets " + offsets->dump() +
           " hold " + std::to_string(entry.end - entry.begin);
  }
  return "";
}

// "" when the entries, in the order of their offsets, cover the `size` bytes of data exactly,
// as Python's safetensors requires; else what is wrong.
std::string check_layout(std::vector<TensorEntry>& entries, uint64_t size) {
  std::sort(entries.begin(), entries.end(),
            [](const TensorEntry& a, const TensorEntry& b) { return std::tie(a.begin, a.end) < std::tie(b.begin, b.end); });
  uint64_t covered = 0;
  const TensorEntry* previous = nullptr;
  for (const auto& entry : entries) {
    const auto range = [&] {
      return "'" + entry.name + "' [" + std::to_string(entry.begin) + ", " + std::to_string(entry.end) + ")";
    };
    if (entry.begin < covered) {
      return "the data of " + range() + " overlaps that of '" + previous->name + "', which ends at " + std::to_string(covered);
    }
    if (entry.begin > covered) {
      return "bytes [" + std::to_string(covered) + ", " + std::to_string(entry.begin) +
             ") of the data belong to no tensor (a gap before " + range() + ")";
    }
    if (entry.end > size) {
      return "the data of " + range() + " reaches past the end of the file, whose data holds " + std::to_string(size) +
             " bytes (truncated?)";
    }
    covered = entry.end;
    previous = &entry;
  }
  if (covered < size) {
    return "the last " + std::to_string(size - covered) + " bytes of the data (from " + std::to_string(covered) +
           ") belong to no tensor";
  }
  return "";
}

at::Tensor make_tensor(const TensorEntry& entry, const char* data, const std::shared_ptr<Mapping>& mapping) {
  const auto options = at::TensorOptions().dtype(entry.dtype->type);
  char* bytes = const_cast<char*>(data) + entry.begin;  // the mapping is writable: copy on write
  if (reinterpret_cast<uintptr_t>(bytes) % entry.dtype->size == 0) {
    return at::from_blob(bytes, entry.shape, [mapping](void*) {}, options);
  }
  at::Tensor copy = at::empty(entry.shape, options);
  std::memcpy(copy.data_ptr(), bytes, entry.end - entry.begin);
  return copy;
}

// The header that follows the 8 bytes of its length, as JSON.
json read_header(const Mapping& mapping, const std::string& path) {
  uint64_t header_size = 0;
  std::memcpy(&header_size, mapping.data(), 8);
  const uint64_t after_length = mapping.size() - 8;
  if (header_size > kMaxHeaderBytes) {
    bad_file(path, "its header length is " + std::to_string(header_size) + " bytes, over the limit of " +
                       std::to_string(kMaxHeaderBytes) + " that Python's safetensors also keeps");
  }
  if (header_size > after_length) {
    bad_file(path, "it is truncated: its header length is " + std::to_string(header_size) + " bytes and only " +
                       std::to_string(after_length) + " follow");
  }
  try {
    return json::parse(mapping.data() + 8, mapping.data() + 8 + header_size);
  } catch (const json::exception& e) {
    bad_file(path, std::string("its header is not JSON (") + e.what() + ")");
  }
}

std::map<std::string, std::string> read_metadata(const json& metadata, const std::string& path) {
  if (!metadata.is_object()) bad_file(path, "its __metadata__ is not an object of strings");
  std::map<std::string, std::string> out;
  for (const auto& [key, value] : metadata.items()) {
    if (!value.is_string()) bad_file(path, "its __metadata__ '" + key + "' is not a string");
    out[key] = value.get<std::string>();
  }
  return out;
}

// A BOOL tensor's bytes must be 0 or 1: any other is undefined behaviour in LibTorch.
void check_bools(const std::vector<TensorEntry>& entries, const char* data, const std::string& path) {
  for (const auto& entry : entries) {
    if (entry.dtype->type != at::kBool) continue;
    const auto* begin = reinterpret_cast<const unsigned char*>(data + entry.begin);
    const auto* end = begin + (entry.end - entry.begin);
    const auto* bad = std::find_if(begin, end, [](unsigned char b) { return b > 1; });
    if (bad != end) bad_file(path, "BOOL tensor '" + entry.name + "' holds the byte " + std::to_string(*bad) + ", not 0 or 1");
  }
}

// The single-file reader: the header checked whole before any tensor is made.
Safetensors load_file(const std::string& path) {
  const auto mapping = map_file(path);
  const json header = read_header(*mapping, path);
  if (!header.is_object()) bad_file(path, "its header is JSON but not an object of tensors");
  Safetensors out;
  std::vector<TensorEntry> entries;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") {
      out.metadata = read_metadata(info, path);
      continue;
    }
    entries.emplace_back();
    if (auto problem = read_tensor_entry(name, info, entries.back()); !problem.empty()) bad_file(path, problem);
  }
  uint64_t header_size = 0;
  std::memcpy(&header_size, mapping->data(), 8);
  const char* data = mapping->data() + 8 + header_size;
  if (auto problem = check_layout(entries, mapping->size() - 8 - header_size); !problem.empty()) bad_file(path, problem);
  check_bools(entries, data, path);
  std::sort(entries.begin(), entries.end(), [](const TensorEntry& a, const TensorEntry& b) { return a.name < b.name; });
  for (const auto& entry : entries) out.tensors.insert(entry.name, make_tensor(entry, data, mapping));
  return out;
}

[[noreturn]] void cannot_save(const std::string& path, const std::string& problem) {
  throw UsageError("saving safetensors '" + path + "': " + problem + ".");
}

struct Planned {
  std::string name;
  const Dtype* dtype;
  at::Tensor tensor;
  uint64_t bytes;
};

std::string header_text(const std::vector<Planned>& planned, const std::map<std::string, std::string>& metadata,
                        const std::string& path) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& item : planned) {
    header[item.name] = {{"dtype", item.dtype->name}, {"shape", item.tensor.sizes().vec()}, {"data_offsets", {offset, offset + item.bytes}}};
    offset += item.bytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    cannot_save(path, std::string("a tensor name or metadata is not valid UTF-8 (") + e.what() + ")");
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // as Python's safetensors pads it
  return text;
}

}  // namespace

bool is_safetensors_path(const std::string& path) {
  return has_ending(path, ".safetensors") || has_ending(path, ".safetensors.index.json");
}

Safetensors load_safetensors(const std::string& path) {
  if (has_ending(path, ".safetensors.index.json")) return detail::load_sharded_safetensors(path);
  return load_file(path);
}

void save_safetensors(const c10::Dict<std::string, at::Tensor>& tensors, const std::string& path,
                      const std::map<std::string, std::string>& metadata) {
  if (has_ending(path, ".safetensors.index.json")) {
    save_sharded_safetensors(tensors, path, kDefaultMaxShardBytes, metadata);
    return;
  }
  std::vector<Planned> planned;
  for (const auto& item : tensors) {
    const at::Tensor& tensor = item.value();
    const std::string& name = item.key();
    if (name == "__metadata__") cannot_save(path, "a tensor is named __metadata__, the name of the header's metadata");
    if (!tensor.defined()) cannot_save(path, "'" + name + "' is an undefined tensor");
    if (tensor.layout() != at::kStrided) cannot_save(path, "'" + name + "' is not a dense tensor; make it dense (to_dense())");
    const Dtype* dtype = dtype_of(tensor.scalar_type());
    if (!dtype) {
      cannot_save(path, "'" + name + "' is a " + std::string(c10::toString(tensor.scalar_type())) +
                            " tensor, and safetensors here holds " + dtype_names() + ": convert it first (.to(torch::kFloat))");
    }
    planned.push_back({name, dtype, tensor, static_cast<uint64_t>(tensor.numel()) * dtype->size});
  }
  std::sort(planned.begin(), planned.end(), [](const Planned& a, const Planned& b) {
    return std::make_pair(a.dtype - kDtypes.data(), a.name) < std::make_pair(b.dtype - kDtypes.data(), b.name);
  });
  const std::string header = header_text(planned, metadata, path);
  detail::write_atomically(path, "saving safetensors", [&](const detail::WriteBytes& write) {
    const uint64_t length = header.size();
    write(reinterpret_cast<const char*>(&length), 8);
    write(header.data(), header.size());
    for (const auto& item : planned) {  // one tensor at a time on the CPU
      const at::Tensor bytes = item.tensor.detach().to(at::kCPU).contiguous();
      write(static_cast<const char*>(bytes.data_ptr()), item.bytes);
    }
  });
}

}  // namespace checkpoint
}  // namespace lockstep
