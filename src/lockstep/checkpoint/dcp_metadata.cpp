// Reading DCP's `.metadata` pickle (dcp_metadata.h): a small pickle machine that builds plain
// values and the allowed dataclasses, then turns them into DcpMetadata.

#include "dcp_metadata.h"

#include <cstring>
#include <memory>
#include <unordered_map>
#include <utility>

#include <lockstep/core/error.h>

#include "pickle_opcodes.h"

namespace lockstep {
namespace checkpoint {
namespace detail {
namespace {

using namespace pickle;  // the opcodes

constexpr uint64_t kMaxString = uint64_t{1} << 26;

enum class Kind { none, boolean, integer, floating, string, tuple, list, dict, callable, cls, object, dtype };

struct Value;
using Ref = std::shared_ptr<Value>;

// A value on the stack or in the memo: a plain Python value, an allowed global, or an object of an
// allowed dataclass with the state BUILD gave it.
struct Value {
  Kind kind = Kind::none;
  int64_t integer = 0;
  double floating = 0;
  std::string text;  // a string; a global's or an object's class name ("TensorStorageMetadata")
  c10::ScalarType dtype = c10::ScalarType::Float;
  std::vector<Ref> items;                     // tuple, list
  std::vector<std::pair<Ref, Ref>> entries;   // dict, in order
  Ref state;                                  // an object's, from BUILD
};

Ref make(Kind kind) {
  auto v = std::make_shared<Value>();
  v->kind = kind;
  return v;
}

const std::map<std::string, c10::ScalarType>& dtypes() {
  static const std::map<std::string, c10::ScalarType> names = {
      {"float32", c10::kFloat},   {"float", c10::kFloat},     {"float64", c10::kDouble}, {"double", c10::kDouble},
      {"float16", c10::kHalf},    {"half", c10::kHalf},       {"bfloat16", c10::kBFloat16}, {"int8", c10::kChar},
      {"uint8", c10::kByte},      {"int16", c10::kShort},     {"short", c10::kShort},    {"int32", c10::kInt},
      {"int", c10::kInt},         {"int64", c10::kLong},      {"long", c10::kLong},      {"bool", c10::kBool},
      {"complex64", c10::kComplexFloat}, {"complex128", c10::kComplexDouble}};
  return names;
}

// The globals a Metadata pickle names: the dataclasses (NEWOBJ then BUILD) and the callables that
// REDUCE rebuilds values with.
Ref global_named(const std::string& module, const std::string& name) {
  static const char* const kMetadata = "torch.distributed.checkpoint.metadata";
  if ((module == kMetadata &&
       (name == "Metadata" || name == "TensorStorageMetadata" || name == "BytesStorageMetadata" ||
        name == "ChunkStorageMetadata" || name == "TensorProperties" || name == "MetadataIndex" ||
        name == "StorageMeta")) ||
      (module == "torch.distributed.checkpoint.filesystem" && name == "_StorageInfo")) {
    auto v = make(Kind::cls);
    v->text = name;
    return v;
  }
  if (module == "torch" && dtypes().count(name)) {
    auto v = make(Kind::dtype);
    v->dtype = dtypes().at(name);
    return v;
  }
  if ((module == "torch" && name == "Size") || (module == "torch.serialization" && name == "_get_layout") ||
      (module == kMetadata && name == "_MEM_FORMAT_ENCODING") ||
      (module == "pathlib" && (name == "PosixPath" || name == "Path" || name == "PurePosixPath"))) {
    auto v = make(Kind::callable);
    v->text = module + "." + name;
    return v;
  }
  return nullptr;
}

class Refusal : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Machine {
 public:
  Machine(const char* data, std::size_t size) : data_(reinterpret_cast<const unsigned char*>(data)), size_(size) {}
  // A pickle can put a container inside itself: the references are cut so that none leaks.
  ~Machine() {
    for (const auto& v : seen_) {
      v->items.clear();
      v->entries.clear();
      v->state.reset();
    }
  }
  Machine(const Machine&) = delete;
  Machine& operator=(const Machine&) = delete;

  Ref run() {
    while (!stopped_) step();
    if (stack_.size() != 1 || !marks_.empty()) fail("it does not end with exactly one value");
    return stack_.back();
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw Refusal(what + " (at byte " + std::to_string(op_at_) + ")");
  }

  const unsigned char* take(uint64_t n) {
    if (n > size_ - pos_) fail("it ends in the middle of an opcode: the file is truncated");
    const unsigned char* at = data_ + pos_;
    pos_ += n;
    return at;
  }
  uint64_t unsigned_le(int n) {
    const unsigned char* p = take(n);
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
    return v;
  }
  std::string text(uint64_t n) {
    if (n > kMaxString) fail("a string of " + std::to_string(n) + " bytes is longer than a Metadata holds");
    const unsigned char* p = take(n);
    return std::string(reinterpret_cast<const char*>(p), n);
  }

  void push(Ref v) {
    seen_.push_back(v);
    stack_.push_back(std::move(v));
  }
  Ref pop() {
    if (stack_.empty() || (!marks_.empty() && marks_.back() == stack_.size())) fail("an opcode takes a missing value");
    Ref v = stack_.back();
    stack_.pop_back();
    return v;
  }
  Ref& top() {
    if (stack_.empty() || (!marks_.empty() && marks_.back() == stack_.size())) fail("an opcode takes a missing value");
    return stack_.back();
  }
  std::vector<Ref> pop_mark() {
    if (marks_.empty()) fail("an opcode takes a MARK that is not there");
    std::vector<Ref> items(stack_.begin() + static_cast<std::ptrdiff_t>(marks_.back()), stack_.end());
    stack_.resize(marks_.back());
    marks_.pop_back();
    return items;
  }
  void push_int(int64_t v) {
    auto r = make(Kind::integer);
    r->integer = v;
    push(r);
  }
  void push_string(std::string s) {
    auto r = make(Kind::string);
    r->text = std::move(s);
    push(r);
  }
  void push_tuple(std::vector<Ref> items) {
    auto r = make(Kind::tuple);
    r->items = std::move(items);
    push(r);
  }
  void memo_put(uint64_t index) { memo_[index] = top(); }
  void memo_get(uint64_t index) {
    const auto it = memo_.find(index);
    if (it == memo_.end()) fail("it reads memo entry " + std::to_string(index) + ", which was never stored");
    push(it->second);
  }

  void step();
  bool step_scalar(unsigned char op);
  void step_container(unsigned char op);
  void push_global(const std::string& module, const std::string& name);
  void reduce();
  void new_object();
  void build();

  const unsigned char* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
  uint64_t op_at_ = 0;
  bool stopped_ = false;
  std::vector<Ref> stack_;
  std::vector<std::size_t> marks_;
  std::unordered_map<uint64_t, Ref> memo_;
  std::vector<Ref> seen_;  // every value pushed
};

void Machine::push_global(const std::string& module, const std::string& name) {
  Ref v = global_named(module, name);
  if (!v) {
    fail("it names the global " + module + "." + name +
         ", which a torch.distributed.checkpoint Metadata does not hold (Lockstep runs no other Python code)");
  }
  push(v);
}

// callable(args): torch.Size -> a tuple of ints, _get_layout and _MEM_FORMAT_ENCODING -> what they
// are given (unused), a pathlib path -> its parts joined.
void Machine::reduce() {
  const Ref args = pop();
  const Ref callable = pop();
  if (callable->kind != Kind::callable || args->kind != Kind::tuple) fail("REDUCE calls something other than an allowed global");
  if (callable->text == "torch.Size") {
    if (args->items.size() != 1 || args->items[0]->kind != Kind::tuple) fail("torch.Size takes one tuple");
    for (const auto& item : args->items[0]->items) {
      if (item->kind != Kind::integer) fail("torch.Size holds something other than integers");
    }
    push(args->items[0]);
    return;
  }
  if (callable->text.rfind("pathlib.", 0) == 0) {
    std::string path;
    for (const auto& item : args->items) {
      if (item->kind != Kind::string) fail("a path holds something other than strings");
      path += (path.empty() || path.back() == '/' ? "" : "/") + item->text;
    }
    push_string(path);
    return;
  }
  if (args->items.size() != 1) fail(callable->text + " takes one argument");
  push(args->items[0]);
}

void Machine::new_object() {
  const Ref args = pop();
  const Ref cls = pop();
  if (cls->kind != Kind::cls || args->kind != Kind::tuple || !args->items.empty()) {
    fail("NEWOBJ builds something other than an allowed dataclass");
  }
  auto object = make(Kind::object);
  object->text = cls->text;
  push(object);
}

void Machine::build() {
  const Ref state = pop();
  const Ref& object = top();
  if (object->kind != Kind::object || object->state) fail("BUILD sets the state of something other than a new dataclass");
  object->state = state;
}

void Machine::step_container(unsigned char op) {
  switch (op) {
    case EMPTY_DICT: push(make(Kind::dict)); return;
    case EMPTY_LIST: push(make(Kind::list)); return;
    case EMPTY_TUPLE: push_tuple({}); return;
    case TUPLE: push_tuple(pop_mark()); return;
    case TUPLE1: case TUPLE2: case TUPLE3: {
      std::vector<Ref> items(op - TUPLE1 + 1);
      for (auto it = items.rbegin(); it != items.rend(); ++it) *it = pop();
      push_tuple(std::move(items));
      return;
    }
    case APPEND: {
      Ref item = pop();
      if (top()->kind != Kind::list) fail("APPEND adds to something other than a list");
      top()->items.push_back(item);
      return;
    }
    case APPENDS: {
      auto items = pop_mark();
      if (top()->kind != Kind::list) fail("APPENDS adds to something other than a list");
      for (auto& item : items) top()->items.push_back(item);
      return;
    }
    case SETITEM: {
      Ref value = pop();
      Ref key = pop();
      if (top()->kind != Kind::dict) fail("SETITEM sets an item of something other than a dict");
      top()->entries.emplace_back(key, value);
      return;
    }
    case SETITEMS: {
      auto items = pop_mark();
      if (items.size() % 2 != 0) fail("SETITEMS has a key without a value");
      if (top()->kind != Kind::dict) fail("SETITEMS sets items of something other than a dict");
      for (std::size_t i = 0; i < items.size(); i += 2) top()->entries.emplace_back(items[i], items[i + 1]);
      return;
    }
    default: fail("opcode " + std::to_string(int(op)) + " is not one a Metadata pickle uses");
  }
}

// The opcodes that push a scalar; false for another.
bool Machine::step_scalar(unsigned char op) {
  switch (op) {
    case NONE: push(make(Kind::none)); return true;
    case NEWTRUE: case NEWFALSE: {
      auto v = make(Kind::boolean);
      v->integer = op == NEWTRUE;
      push(v);
      return true;
    }
    case BININT: push_int(static_cast<int32_t>(unsigned_le(4))); return true;
    case BININT1: push_int(static_cast<int64_t>(unsigned_le(1))); return true;
    case BININT2: push_int(static_cast<int64_t>(unsigned_le(2))); return true;
    case LONG1: {
      const int n = *take(1);
      if (n > 8) fail("an integer of " + std::to_string(n) + " bytes is larger than a Metadata holds");
      uint64_t v = n == 0 ? 0 : unsigned_le(n);
      if (n > 0 && n < 8 && (v >> (8 * n - 1)) != 0) v |= ~uint64_t{0} << (8 * n);  // sign-extend
      push_int(static_cast<int64_t>(v));
      return true;
    }
    case BINFLOAT: {
      const unsigned char* p = take(8);
      uint64_t bits = 0;
      for (int i = 0; i < 8; ++i) bits = (bits << 8) | p[i];
      auto v = make(Kind::floating);
      std::memcpy(&v->floating, &bits, sizeof bits);
      push(v);
      return true;
    }
    case SHORT_BINUNICODE: push_string(text(unsigned_le(1))); return true;
    case BINUNICODE: push_string(text(unsigned_le(4))); return true;
    case BINUNICODE8: push_string(text(unsigned_le(8))); return true;
    default: return false;
  }
}

void Machine::step() {
  op_at_ = pos_;
  const unsigned char op = *take(1);
  if (step_scalar(op)) return;
  switch (op) {
    case PROTO: if (*take(1) > 5) fail("its pickle protocol is newer than 5"); return;
    case FRAME: take(8); return;  // a length hint; the opcodes that follow are read one by one
    case STOP: stopped_ = true; return;
    case MARK: marks_.push_back(stack_.size()); return;
    case GLOBAL: {
      std::string module, name;
      for (std::string* part : {&module, &name}) {
        for (char c; (c = static_cast<char>(*take(1))) != '\n';) {
          if (part->size() >= 256) fail("a global's name is longer than 256 bytes");
          part->push_back(c);
        }
      }
      push_global(module, name);
      return;
    }
    case STACK_GLOBAL: {
      const Ref name = pop();
      const Ref module = pop();
      if (module->kind != Kind::string || name->kind != Kind::string) fail("STACK_GLOBAL takes two strings");
      push_global(module->text, name->text);
      return;
    }
    case REDUCE: reduce(); return;
    case NEWOBJ: new_object(); return;
    case BUILD: build(); return;
    case MEMOIZE: memo_put(memo_.size()); return;
    case BINPUT: memo_put(unsigned_le(1)); return;
    case LONG_BINPUT: memo_put(unsigned_le(4)); return;
    case BINGET: memo_get(unsigned_le(1)); return;
    case LONG_BINGET: memo_get(unsigned_le(4)); return;
    default: step_container(op);
  }
}

// --- from values to DcpMetadata --------------------------------------------------------------

// The entries of an object's dict state, or of a dict; `what` names it in messages.
const std::vector<std::pair<Ref, Ref>>& entries_of(const Ref& v, const std::string& what) {
  if (v->kind == Kind::object && v->state && v->state->kind == Kind::dict) return v->state->entries;
  if (v->kind == Kind::dict) return v->entries;
  throw Refusal(what + " is not a dataclass with its fields");
}

Ref field(const Ref& object, const std::string& name, const std::string& what, bool required = true) {
  for (const auto& [key, value] : entries_of(object, what)) {
    if (key->kind == Kind::string && key->text == name) return value;
  }
  if (required) throw Refusal(what + " has no field '" + name + "'");
  return nullptr;
}

void expect(const Ref& v, Kind kind, const std::string& what) {
  if (!v || v->kind != kind) throw Refusal(what + " has the wrong type");
}

bool is_object(const Ref& v, const char* cls) { return v->kind == Kind::object && v->text == cls; }

std::vector<int64_t> ints(const Ref& v, const std::string& what) {
  expect(v, Kind::tuple, what);
  std::vector<int64_t> out;
  for (const auto& item : v->items) {
    expect(item, Kind::integer, what);
    out.push_back(item->integer);
  }
  return out;
}

std::string string_field(const Ref& object, const std::string& name, const std::string& what) {
  const Ref v = field(object, name, what);
  expect(v, Kind::string, what + "." + name);
  return v->text;
}

c10::ScalarType dtype_of(const Ref& properties, const std::string& what) {
  if (!is_object(properties, "TensorProperties") || !properties->state) throw Refusal(what + " has no TensorProperties");
  // Its __getstate__ gives (dtype, layout, requires_grad, memory format, pin_memory[, strides]).
  const Ref state = properties->state;
  const Ref dtype = state->kind == Kind::tuple && !state->items.empty() ? state->items[0] : field(properties, "dtype", what);
  expect(dtype, Kind::dtype, what + "'s dtype");
  return dtype->dtype;
}

DcpItem item_of(const std::string& fqn, const Ref& v) {
  const std::string what = "state_dict_metadata['" + fqn + "']";
  DcpItem item;
  if (is_object(v, "BytesStorageMetadata")) return item;
  if (!is_object(v, "TensorStorageMetadata")) throw Refusal(what + " is neither TensorStorageMetadata nor BytesStorageMetadata");
  item.is_tensor = true;
  item.dtype = dtype_of(field(v, "properties", what), what);
  item.size = ints(field(v, "size", what), what + ".size");
  const Ref chunks = field(v, "chunks", what);
  expect(chunks, Kind::list, what + ".chunks");
  for (const auto& chunk : chunks->items) {
    if (!is_object(chunk, "ChunkStorageMetadata")) throw Refusal(what + " holds a chunk that is not ChunkStorageMetadata");
    item.chunks.push_back({ints(field(chunk, "offsets", what), what + ".offsets"),
                           ints(field(chunk, "sizes", what), what + ".sizes")});
  }
  return item;
}

DcpStorage storage_of(const Ref& index, const Ref& info) {
  if (!is_object(index, "MetadataIndex") || !is_object(info, "_StorageInfo")) {
    throw Refusal("storage_data holds something other than MetadataIndex: _StorageInfo");
  }
  DcpStorage s;
  s.fqn = string_field(index, "fqn", "a MetadataIndex");
  const Ref offsets = field(index, "offset", "a MetadataIndex", false);
  s.has_offsets = offsets && offsets->kind != Kind::none;
  if (s.has_offsets) s.chunk_offsets = ints(offsets, "MetadataIndex('" + s.fqn + "').offset");
  const std::string what = "the _StorageInfo of '" + s.fqn + "'";
  s.relative_path = string_field(info, "relative_path", what);
  for (auto [name, out] : {std::pair<const char*, int64_t*>{"offset", &s.offset}, {"length", &s.length}}) {
    const Ref v = field(info, name, what);
    expect(v, Kind::integer, what + "." + name);
    *out = v->integer;
  }
  const Ref transforms = field(info, "transform_descriptors", what, false);
  if (transforms && transforms->kind != Kind::none && !transforms->items.empty()) {
    throw Refusal(what + " was written through a stream extension (transform_descriptors, e.g. compression), "
                         "which Lockstep does not read; save it with FileSystemWriter's default _extensions=None");
  }
  return s;
}

DcpPath path_of(const Ref& v, const std::string& fqn) {
  expect(v, Kind::tuple, "planner_data['" + fqn + "']");
  DcpPath path;
  for (const auto& part : v->items) {
    if (part->kind == Kind::string) {
      path.emplace_back(part->text);
    } else if (part->kind == Kind::integer) {
      path.emplace_back(part->integer);
    } else {
      throw Refusal("planner_data['" + fqn + "'] holds something other than strings and integers");
    }
  }
  return path;
}

DcpMetadata metadata_of(const Ref& root) {
  if (!is_object(root, "Metadata")) throw Refusal("it does not hold a torch.distributed.checkpoint Metadata");
  DcpMetadata out;
  const Ref items = field(root, "state_dict_metadata", "Metadata");
  expect(items, Kind::dict, "Metadata.state_dict_metadata");
  for (const auto& [key, value] : items->entries) {
    expect(key, Kind::string, "a key of state_dict_metadata");
    if (!out.items.emplace(key->text, item_of(key->text, value)).second) throw Refusal("'" + key->text + "' is listed twice");
  }
  const Ref storage = field(root, "storage_data", "Metadata");
  expect(storage, Kind::dict, "Metadata.storage_data");
  for (const auto& [index, info] : storage->entries) out.storage.push_back(storage_of(index, info));
  const Ref planner = field(root, "planner_data", "Metadata", false);
  if (planner && planner->kind == Kind::dict) {
    for (const auto& [key, value] : planner->entries) {
      expect(key, Kind::string, "a key of planner_data");
      out.planner_data[key->text] = path_of(value, key->text);
    }
  }
  const Ref version = field(root, "version", "Metadata", false);
  if (version && version->kind == Kind::string) out.version = version->text;
  return out;
}

}  // namespace

DcpMetadataRead parse_dcp_metadata(const char* data, std::size_t size) {
  DcpMetadataRead read;
  try {
    Machine machine(data, size);
    read.metadata = metadata_of(machine.run());
  } catch (const Refusal& e) {
    read.problem = e.what();
  }
  return read;
}

}  // namespace detail
}  // namespace checkpoint
}  // namespace lockstep
