// Writing DCP's `.metadata` pickle (dcp_metadata.h): protocol 2, each dataclass built as Python's
// pickle builds one (the class, NEWOBJ with no arguments, BUILD with its fields), the classes
// memoised once.

#include "dcp_metadata.h"

#include <cstring>

#include <lockstep/core/error.h>

#include "pickle_opcodes.h"

namespace lockstep {
namespace checkpoint {
namespace detail {
namespace {

using namespace pickle;  // the opcodes

constexpr const char* kMetadataModule = "torch.distributed.checkpoint.metadata";

// Python's name of a dtype in the torch module ("float32").
std::string python_dtype(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::kFloat: return "float32";
    case c10::kDouble: return "float64";
    case c10::kHalf: return "float16";
    case c10::kBFloat16: return "bfloat16";
    case c10::kChar: return "int8";
    case c10::kByte: return "uint8";
    case c10::kShort: return "int16";
    case c10::kInt: return "int32";
    case c10::kLong: return "int64";
    case c10::kBool: return "bool";
    case c10::kComplexFloat: return "complex64";
    case c10::kComplexDouble: return "complex128";
    default: throw UsageError(std::string("a DCP checkpoint cannot hold a tensor of dtype ") + c10::toString(dtype));
  }
}

class Pickler {
 public:
  std::string out;

  void op(Op c) { out.push_back(static_cast<char>(c)); }
  void le(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  void integer(int64_t v) {
    if (v >= 0 && v < 256) {
      op(BININT1);
      le(static_cast<uint64_t>(v), 1);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
      op(BININT);
      le(static_cast<uint64_t>(static_cast<uint32_t>(static_cast<int32_t>(v))), 4);
    } else {
      op(LONG1);  // 8 bytes, two's complement
      le(8, 1);
      le(static_cast<uint64_t>(v), 8);
    }
  }
  void string(const std::string& s) {
    op(BINUNICODE);
    le(s.size(), 4);
    out += s;
  }
  void none() { op(NONE); }
  void boolean(bool b) { op(b ? NEWTRUE : NEWFALSE); }
  void mark() { op(MARK); }
  // A global, memoised on first use.
  void global(const std::string& module, const std::string& name) {
    const std::string key = module + "\n" + name + "\n";
    const auto it = memo_.find(key);
    if (it != memo_.end()) {
      op(LONG_BINGET);
      le(it->second, 4);
      return;
    }
    op(GLOBAL);
    out += key;
    op(LONG_BINPUT);
    le(memo_.size(), 4);
    memo_.emplace(key, static_cast<uint32_t>(memo_.size()));
  }
  // cls() with no arguments, as NEWOBJ does; BUILD follows with its state.
  void new_object(const std::string& module, const std::string& name) {
    global(module, name);
    op(EMPTY_TUPLE);
    op(NEWOBJ);
  }
  // A dataclass whose state is the dict of its fields: the fields follow, then end_fields().
  void begin_fields(const std::string& module, const std::string& name) {
    new_object(module, name);
    op(EMPTY_DICT);
    mark();
  }
  void end_fields() {
    op(SETITEMS);
    op(BUILD);
  }
  void tuple(const std::vector<int64_t>& values) {
    mark();
    for (int64_t v : values) integer(v);
    op(TUPLE);
  }
  void size(const std::vector<int64_t>& values) {  // torch.Size((...))
    global("torch", "Size");
    tuple(values);
    op(TUPLE1);
    op(REDUCE);
  }

 private:
  std::map<std::string, uint32_t> memo_;
};

// TensorProperties' __setstate__ takes (dtype, layout, requires_grad, memory format, pin_memory).
void tensor_properties(Pickler& p, c10::ScalarType dtype) {
  p.new_object(kMetadataModule, "TensorProperties");
  p.mark();
  p.global("torch", python_dtype(dtype));
  p.global("torch.serialization", "_get_layout");
  p.string("torch.strided");
  p.op(TUPLE1);
  p.op(REDUCE);
  p.boolean(false);
  p.global(kMetadataModule, "_MEM_FORMAT_ENCODING");
  p.integer(0);  // TORCH_CONTIGUOUS_FORMAT
  p.op(TUPLE1);
  p.op(REDUCE);
  p.boolean(false);
  p.op(TUPLE);
  p.op(BUILD);
}

void item(Pickler& p, const DcpItem& item) {
  if (!item.is_tensor) {
    p.new_object(kMetadataModule, "BytesStorageMetadata");
    return;
  }
  p.begin_fields(kMetadataModule, "TensorStorageMetadata");
  p.string("properties");
  tensor_properties(p, item.dtype);
  p.string("size");
  p.size(item.size);
  p.string("chunks");
  p.op(EMPTY_LIST);
  p.mark();
  for (const auto& chunk : item.chunks) {
    p.begin_fields(kMetadataModule, "ChunkStorageMetadata");
    p.string("offsets");
    p.size(chunk.offsets);
    p.string("sizes");
    p.size(chunk.sizes);
    p.end_fields();
  }
  p.op(APPENDS);
  p.end_fields();
}

// MetadataIndex(fqn, offset, index) and _StorageInfo(relative_path, offset, length), by their
// fields as Python pickles them (index None: only a lookup hint).
void storage(Pickler& p, const DcpStorage& s) {
  p.begin_fields(kMetadataModule, "MetadataIndex");
  p.string("fqn");
  p.string(s.fqn);
  if (s.has_offsets) {
    p.string("offset");
    p.size(s.chunk_offsets);
  }
  p.string("index");
  p.none();
  p.end_fields();
  p.begin_fields("torch.distributed.checkpoint.filesystem", "_StorageInfo");
  p.string("relative_path");
  p.string(s.relative_path);
  p.string("offset");
  p.integer(s.offset);
  p.string("length");
  p.integer(s.length);
  p.end_fields();
}

void planner_path(Pickler& p, const DcpPath& path) {
  p.mark();
  for (const auto& part : path) {
    if (const auto* s = std::get_if<std::string>(&part)) {
      p.string(*s);
    } else {
      p.integer(std::get<int64_t>(part));
    }
  }
  p.op(TUPLE);
}

}  // namespace

std::string write_dcp_metadata(const DcpMetadata& metadata) {
  Pickler p;
  p.op(PROTO);
  p.le(2, 1);
  p.begin_fields(kMetadataModule, "Metadata");
  p.string("state_dict_metadata");
  p.op(EMPTY_DICT);
  p.mark();
  for (const auto& [fqn, entry] : metadata.items) {
    p.string(fqn);
    item(p, entry);
  }
  p.op(SETITEMS);
  p.string("planner_data");
  p.op(EMPTY_DICT);
  p.mark();
  for (const auto& [fqn, path] : metadata.planner_data) {
    p.string(fqn);
    planner_path(p, path);
  }
  p.op(SETITEMS);
  p.string("storage_data");
  p.op(EMPTY_DICT);
  p.mark();
  for (const auto& s : metadata.storage) storage(p, s);
  p.op(SETITEMS);
  p.string("storage_meta");
  p.none();
  p.string("version");
  p.string(metadata.version);
  p.end_fields();
  p.op(STOP);
  return p.out;
}

}  // namespace detail
}  // namespace checkpoint
}  // namespace lockstep
