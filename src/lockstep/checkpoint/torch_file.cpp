#include "torch_file.h"

#include <cstring>
#include <memory>
#include <unordered_map>
#include <unordered_set>

#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/read_adapter_interface.h>
#include <c10/util/Exception.h>
#include <torch/csrc/jit/serialization/unpickler.h>

#include <lockstep/core/error.h>

#include "torch_pickle.h"

namespace lockstep {
namespace checkpoint {
namespace detail {
namespace {

// The archive's bytes for LibTorch's zip reader; a read past the end returns what there is.
class BytesAdapter final : public caffe2::serialize::ReadAdapterInterface {
 public:
  explicit BytesAdapter(const std::vector<char>& bytes) : bytes_(bytes) {}
  size_t size() const override { return bytes_.size(); }
  size_t read(uint64_t pos, void* buf, size_t n, const char* /*what*/) const override {
    if (pos >= bytes_.size()) return 0;
    n = std::min<uint64_t>(n, bytes_.size() - pos);
    std::memcpy(buf, bytes_.data() + pos, n);
    return n;
  }

 private:
  const std::vector<char>& bytes_;
};

// The size of the record behind each storage that the unpickler read, by its data pointer.
using RecordSizes = std::unordered_map<const void*, size_t>;

// "" when `tensor` lies inside the bytes its record holds; else what is wrong.
std::string check_tensor(const at::Tensor& tensor, const RecordSizes& records) {
  if (!tensor.defined()) return "";
  if (tensor.layout() != at::kStrided) return "a tensor is not dense (strided)";
  const auto& storage = tensor.storage();
  const auto record = records.find(storage.data());
  const size_t stored = record == records.end() ? 0 : record->second;
  if (storage.nbytes() > stored) {
    return "a tensor storage claims " + std::to_string(storage.nbytes()) + " bytes and its record holds " +
           std::to_string(stored);
  }
  if (tensor.storage_offset() < 0) return "a tensor has a negative storage offset";
  __int128 last = tensor.storage_offset();
  bool empty = false;
  for (int64_t d = 0; d < tensor.dim(); ++d) {
    if (tensor.size(d) < 0 || tensor.stride(d) < 0) return "a tensor has a negative size or stride";
    empty = empty || tensor.size(d) == 0;
    last += static_cast<__int128>(tensor.size(d) - 1) * tensor.stride(d);
  }
  if (empty) return "";
  if ((last + 1) * static_cast<__int128>(tensor.element_size()) > static_cast<__int128>(storage.nbytes())) {
    return "a tensor's sizes and strides reach past its storage";
  }
  return "";
}

// Every tensor in `value`; each container once (the memo can share one in many places).
std::string check_tensors(const c10::IValue& value, const RecordSizes& records,
                          std::unordered_set<const void*>& seen) {
  if (value.isTensor()) return check_tensor(value.toTensor(), records);
  if (!value.isGenericDict() && !value.isList() && !value.isTuple()) return "";
  if (!seen.insert(value.internalToPointer()).second) return "";
  std::vector<c10::IValue> children;
  if (value.isGenericDict()) {
    for (const auto& entry : value.toGenericDict()) children.push_back(entry.value());
  } else if (value.isList()) {
    for (const auto& item : value.toListRef()) children.push_back(item);
  } else {
    for (const auto& item : value.toTupleRef().elements()) children.push_back(item);
  }
  for (const auto& child : children) {
    if (auto problem = check_tensors(child, records, seen); !problem.empty()) return problem;
  }
  return "";
}

c10::IValue unpickle(caffe2::serialize::PyTorchStreamReader& archive, const std::vector<char>& pickle,
                     RecordSizes& records) {
  size_t offset = 0;
  auto read = [&](char* buffer, size_t length) -> size_t {
    length = std::min(length, pickle.size() - offset);
    std::memcpy(buffer, pickle.data() + offset, length);
    offset += length;
    return length;
  };
  auto read_record = [&](const std::string& name) {
    auto [data, size] = archive.getRecord("data/" + name);
    records[data.get()] = size;
    return std::move(data);
  };
  torch::jit::Unpickler unpickler(read, /*type_resolver=*/nullptr, /*obj_loader=*/nullptr, read_record,
                                  at::Device(at::kCPU));
  unpickler.set_version(archive.version());
  return unpickler.parse_ivalue();
}

}  // namespace

TorchFile read_torch_file(const std::vector<char>& bytes) {
  TorchFile file;
  try {
    caffe2::serialize::PyTorchStreamReader archive(std::make_shared<BytesAdapter>(bytes));
    auto [data, size] = archive.getRecord("data.pkl");
    const PickleRewrite rewrite = rewrite_torch_pickle(static_cast<const char*>(data.get()), size);
    if (!rewrite.problem.empty()) return TorchFile{{}, rewrite.problem, rewrite.damaged};
    RecordSizes records;
    file.value = unpickle(archive, rewrite.pickle, records);
    std::unordered_set<const void*> seen;
    if (auto problem = check_tensors(file.value, records, seen); !problem.empty()) {
      return TorchFile{{}, problem, true};
    }
  } catch (const c10::Error& e) {
    return TorchFile{{}, std::string("LibTorch cannot read it (") + e.what_without_backtrace() + ")", true};
  } catch (const std::exception& e) {
    return TorchFile{{}, "LibTorch cannot read it (" + message_of(e) + ")", true};
  }
  return file;
}

}  // namespace detail
}  // namespace checkpoint
}  // namespace lockstep
