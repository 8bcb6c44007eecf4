#include "torch_pickle.h"

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <utility>

#include <lockstep/core/error.h>

#include "pickle_opcodes.h"

namespace lockstep {
namespace checkpoint {
namespace detail {
namespace {

using namespace pickle;  // the opcodes

constexpr int kMaxDepth = 100;
constexpr uint64_t kMaxGlobalName = 1024;

// dict_class: a class whose instances are read as plain dicts (OrderedDict, defaultdict,
// Lightning's AttributeDict); dict_object: such an instance; factory: a builtin type, only as
// the default factory of a defaultdict (which is dropped with it).
enum class Kind { none, scalar, dict, dict_object, list, tuple, empty_tuple, function, dict_class, factory, object };

// What a stack or memo entry holds, as far as the rewrite needs to know.
struct Node {
  Kind kind = Kind::object;
  int depth = 0;        // containers nested inside, itself included
  bool shared = false;  // fetched again from the memo: filling it now would build a cycle
  std::string bytes;    // a scalar's or None's opcode, to write it again where the memo entry was dropped
  bool holds_factory = false;  // a factory, or a tuple with one: only a defaultdict may take it
};

struct Item {
  int node;
  uint64_t start;  // where the opcodes that build it begin: they push it and touch nothing below
};

struct MemoEntry {
  int node = -1;
  uint64_t put_at = 0;
};

// Bytes [begin, end) of the input replaced by `bytes` (begin == end: an insertion).
struct Edit {
  uint64_t begin, end;
  std::string bytes;
};

// Ends the rewrite; rewrite_torch_pickle returns its text as the problem.
class Refusal : public UsageError {
 public:
  Refusal(const std::string& text, bool damaged) : UsageError(text), damaged(damaged) {}
  bool damaged;
};

bool is_container(Kind k) { return k == Kind::dict || k == Kind::dict_object || k == Kind::list; }

// Classes whose instances are plain dicts: torch.save(model.state_dict()) writes OrderedDicts,
// and Lightning's checkpoints an AttributeDict for hyper_parameters, sometimes a defaultdict.
bool is_dict_class(const std::string& module, const std::string& name) {
  return (module == "collections" && (name == "OrderedDict" || name == "defaultdict")) ||
         (name == "AttributeDict" && (module == "lightning_fabric.utilities.data" ||
                                      module == "lightning.fabric.utilities.data" ||
                                      module == "pytorch_lightning.utilities.parsing" ||
                                      module == "lightning.pytorch.utilities.parsing"));
}

// The builtin types a defaultdict's default factory may be.
bool is_factory(const std::string& module, const std::string& name) {
  return (module == "builtins" || module == "__builtin__") &&
         (name == "list" || name == "dict" || name == "int" || name == "float" || name == "str" || name == "set");
}

class Rewriter {
 public:
  Rewriter(const char* data, std::size_t size) : data_(reinterpret_cast<const unsigned char*>(data)), size_(size) {}

  std::vector<char> run() {
    if (size_ < 2 || data_[0] != PROTO) malformed("it does not start with a pickle protocol opcode");
    if (data_[1] != 2) {
      refuse("was saved with pickle protocol " + std::to_string(data_[1]) +
             " (torch.save(..., pickle_protocol=" + std::to_string(data_[1]) + ")), and Lockstep reads protocol 2, "
             "torch.save's default. Save it again without pickle_protocol");
    }
    pos_ = 2;
    while (!stopped_) step();
    return apply_edits();
  }

 private:
  [[noreturn]] void malformed(const std::string& what) const {
    throw Refusal{"its pickle (data.pkl) is malformed: " + what + " (at byte " + std::to_string(op_at_) + ")", true};
  }
  [[noreturn]] void refuse(const std::string& text) const { throw Refusal{text, false}; }

  uint64_t read(int width) {
    if (size_ - pos_ < static_cast<uint64_t>(width)) malformed("it ends inside an opcode's argument");
    uint64_t value = 0;
    for (int i = width - 1; i >= 0; --i) value = (value << 8) | data_[pos_ + i];
    pos_ += width;
    return value;
  }

  void skip(uint64_t length) {
    if (size_ - pos_ < length) malformed("a string runs past the end of the pickle");
    pos_ += length;
  }

  std::string line() {
    const uint64_t limit = std::min<uint64_t>(size_ - pos_, kMaxGlobalName);
    const auto* end = std::find(data_ + pos_, data_ + pos_ + limit, '\n');
    if (end == data_ + pos_ + limit) malformed("a global's name is not ended by a newline");
    std::string text(reinterpret_cast<const char*>(data_ + pos_), end - (data_ + pos_));
    pos_ += text.size() + 1;
    return text;
  }

  int make(Kind kind, int depth = 0, std::string bytes = {}) {
    nodes_.push_back(Node{kind, depth, false, std::move(bytes)});
    return static_cast<int>(nodes_.size()) - 1;
  }
  Node& node(const Item& item) { return nodes_[item.node]; }

  void push(int node, uint64_t start) { stack_.push_back(Item{node, start}); }
  void push_new(Kind kind, int depth = 0) { push(make(kind, depth), op_at_); }
  void push_scalar(Kind kind) {
    push(make(kind, 0, std::string(reinterpret_cast<const char*>(data_ + op_at_), pos_ - op_at_)), op_at_);
  }

  Item& top() {
    if (stack_.empty() || stack_.back().node < 0) malformed("an opcode needs a value and the stack has none");
    return stack_.back();
  }

  // The top value, removed. Only REDUCE and NEWOBJ may take a dict class (as their callable).
  Item pop() {
    Item item = top();
    if (node(item).kind == Kind::dict_class) refuse_dict_class_use();
    stack_.pop_back();
    return item;
  }

  std::vector<Item> pop_to_mark() {
    if (marks_.empty()) malformed("an opcode needs a MARK and there is none");
    const std::size_t mark = marks_.back();
    marks_.pop_back();
    std::vector<Item> items(stack_.begin() + mark + 1, stack_.end());
    for (const auto& item : items) {
      if (node(item).kind == Kind::dict_class) refuse_dict_class_use();
    }
    stack_.resize(mark);
    return items;
  }

  // A builtin type anywhere but in the arguments of a defaultdict (which are dropped).
  void refuse_factory(const Item& item) const {
    if (!nodes_[item.node].holds_factory) return;
    refuse("holds a Python type (builtins) other than as a defaultdict's default factory (at byte " +
           std::to_string(op_at_) + "), which Lockstep does not read. Save plain dicts of tensors, e.g. "
           "torch.save(model.state_dict(), path)");
  }

  [[noreturn]] void refuse_dict_class_use() const {
    refuse("uses a dict class (collections.OrderedDict, defaultdict, Lightning's AttributeDict) other than as a "
           "dict (at byte " + std::to_string(op_at_) +
           "), which Lockstep does not read. Save plain dicts of tensors, e.g. torch.save(model.state_dict(), path)");
  }

  void nest(Node& container, const Node& child) {
    container.depth = std::max(container.depth, child.depth + 1);
    if (container.depth > kMaxDepth) {
      refuse("nests dicts, lists or tuples more than " + std::to_string(kMaxDepth) + " deep, which Lockstep does "
             "not load. Save a flatter structure (a state_dict is 1 deep)");
    }
  }

  Item& container_below(Kind kind, const char* what) {
    Item& target = top();
    Node& n = node(target);
    const bool fits = kind == Kind::dict ? (n.kind == Kind::dict || n.kind == Kind::dict_object) : n.kind == kind;
    if (!fits) malformed(std::string("it adds items to something that is not a ") + what);
    if (n.shared) {
      refuse("holds a " + std::string(what) + " that contains itself (a recursive structure), which Lockstep does "
             "not load. Save a structure without cycles");
    }
    return target;
  }

  void add_items(const std::vector<Item>& items) {
    Item& list = container_below(Kind::list, "list");
    for (const auto& item : items) {
      refuse_factory(item);
      nest(node(list), node(item));
    }
  }

  void set_items(const std::vector<Item>& items) {
    if (items.size() % 2 != 0) malformed("a dict gets a key without a value");
    Item& dict = container_below(Kind::dict, "dict");
    for (std::size_t i = 0; i < items.size(); i += 2) {
      refuse_factory(items[i + 1]);
      if (node(items[i]).kind != Kind::scalar) {
        refuse("holds a dict whose keys are not strings or numbers, which Lockstep does not load. Use string keys, "
               "as a state_dict does");
      }
      nest(node(dict), node(items[i + 1]));
    }
  }

  // SETITEM and APPEND (one item), which LibTorch 1.13 lacks, as SETITEMS and APPENDS: a MARK
  // goes where the first item's opcodes begin.
  void single_item(std::size_t count, char batch_opcode) {
    if (stack_.size() < count + 1) malformed("an opcode needs more values than the stack holds");
    std::vector<Item> items(stack_.end() - count, stack_.end());
    for (std::size_t i = 0; i < count; ++i) pop();
    edits_.push_back(Edit{items.front().start, items.front().start, "("});
    edits_.push_back(Edit{op_at_, pos_, std::string(1, batch_opcode)});
    count == 1 ? add_items(items) : set_items(items);
  }

  void make_tuple(const std::vector<Item>& items) {
    const int tuple = make(items.empty() ? Kind::empty_tuple : Kind::tuple, 1);
    for (const auto& item : items) {
      nest(nodes_[tuple], node(item));
      nodes_[tuple].holds_factory = nodes_[tuple].holds_factory || node(item).holds_factory;
    }
    push(tuple, items.empty() ? op_at_ : items.front().start);
  }

  void tuple_of(std::size_t count) {
    if (stack_.size() < count) malformed("a tuple needs more values than the stack holds");
    std::vector<Item> items(stack_.end() - count, stack_.end());
    for (std::size_t i = 0; i < count; ++i) pop();
    make_tuple(items);
  }

  // Python writes an integer that does not fit in 4 bytes with as few bytes as it needs;
  // LibTorch 1.13 reads only 8.
  void long1() {
    const uint64_t length = read(1);
    if (length > 8) refuse("holds an integer wider than 64 bits, which LibTorch cannot hold. Store it as a string");
    uint64_t value = length == 0 ? 0 : read(static_cast<int>(length));
    if (length > 0 && length < 8 && (value >> (8 * length - 1)) & 1) value |= ~uint64_t{0} << (8 * length);
    std::string bytes{static_cast<char>(LONG1), 8};
    for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
    if (length != 8) edits_.push_back(Edit{op_at_, pos_, bytes});
    push(make(Kind::scalar, 0, bytes), op_at_);
  }

  void put(uint64_t id) {
    const Item& item = top();
    if (id > memo_.size()) malformed("a memo index skips ahead of those used so far");
    if (id == memo_.size()) memo_.emplace_back();
    memo_[id] = MemoEntry{item.node, op_at_};
  }

  bool dropped(uint64_t at) const {
    auto it = std::upper_bound(dropped_.begin(), dropped_.end(), at,
                               [](uint64_t p, const std::pair<uint64_t, uint64_t>& r) { return p < r.first; });
    return it != dropped_.begin() && at < std::prev(it)->second;
  }

  void get(uint64_t id) {
    if (id >= memo_.size() || memo_[id].node < 0) malformed("a memo index refers to nothing stored");
    const MemoEntry& entry = memo_[id];
    Node& n = nodes_[entry.node];
    // A class fetched again (a second OrderedDict, or defaultdict(list)) is dropped with its call.
    if (n.kind != Kind::dict_class && n.kind != Kind::factory && dropped(entry.put_at)) {
      // Stored inside what was dropped (an OrderedDict's attributes): written again in its place.
      if (n.kind != Kind::scalar && n.kind != Kind::none) {
        refuse("refers back into an OrderedDict's attributes (at byte " + std::to_string(op_at_) + "), which "
               "Lockstep drops. Save plain dicts of tensors, e.g. torch.save(model.state_dict(), path)");
      }
      edits_.push_back(Edit{op_at_, pos_, n.bytes});
    }
    if (is_container(n.kind)) n.shared = true;
    push(entry.node, op_at_);
  }

  // Everything in [begin, pos_) leaves the stream (and `replacement` takes its place): edits
  // recorded inside it go, and its memo entries count as dropped.
  void drop_since(uint64_t begin, const std::string& replacement) {
    while (!edits_.empty() && edits_.back().begin >= begin) edits_.pop_back();
    while (!dropped_.empty() && dropped_.back().first >= begin) dropped_.pop_back();
    edits_.push_back(Edit{begin, pos_, replacement});
    dropped_.emplace_back(begin, pos_);
  }

  void global() {
    const std::string module = line();
    const std::string name = line();
    if (is_dict_class(module, name)) return push_new(Kind::dict_class);
    if (is_factory(module, name)) {
      push_new(Kind::factory);
      nodes_.back().holds_factory = true;
      nodes_.back().bytes = module + "." + name;  // for refuse_class, where it is called
      return;
    }
    const bool storage = module == "torch" && name.size() > 7 && name.compare(name.size() - 7, 7, "Storage") == 0;
    if ((module == "torch._utils" && name == "_rebuild_tensor_v2") || storage || (module == "torch" && name == "device") ||
        module == "torch.jit._pickle") {
      return push_new(Kind::function);
    }
    refuse_class(module + "." + name);
  }

  [[noreturn]] void refuse_class(const std::string& name) const {
    if (name == "torch._utils._rebuild_parameter") {
      refuse("holds an nn.Parameter (torch._utils._rebuild_parameter), and Lockstep reads plain tensors. Save "
             "tensors instead: torch.save(model.state_dict(), path) holds them, or p.detach() for one");
    }
    const bool module = name.rfind("torch.nn.", 0) == 0 || name.rfind("__main__.", 0) == 0;
    refuse("holds a pickled Python object of class " + name + (module ? " (torch.save(model) pickles the whole module)" : "") +
           ", which only Python can rebuild; Lockstep reads tensors, numbers, strings and dicts, lists and tuples of "
           "them. Save the weights instead: torch.save(model.state_dict(), path)");
  }

  // OrderedDict() and defaultdict(factory) become an empty dict, their arguments dropped; the
  // tensor functions stay for LibTorch's unpickler.
  void reduce() {
    const Item args = pop();
    const Item callable = top();
    const Kind kind = node(callable).kind;
    if (kind == Kind::factory) refuse_class(node(callable).bytes);  // set(...), list(...): Python objects
    if (kind != Kind::function && kind != Kind::dict_class) malformed("REDUCE calls something that is not a function");
    stack_.pop_back();
    if (kind == Kind::dict_class) return make_dict_object(callable, args);
    refuse_factory(args);
    push(make(Kind::object, node(args).depth), callable.start);
  }

  // NEWOBJ (cls.__new__(cls, *args)): how an AttributeDict, a dict subclass, is pickled.
  void newobj() {
    const Item args = pop();
    const Item cls = top();
    if (node(cls).kind == Kind::factory) refuse_class(node(cls).bytes);
    if (node(cls).kind != Kind::dict_class) malformed("NEWOBJ builds something that is not a class");
    stack_.pop_back();
    make_dict_object(cls, args);
  }

  void make_dict_object(const Item& cls, const Item& args) {
    const Kind kind = node(args).kind;
    if (kind != Kind::empty_tuple && !(kind == Kind::tuple && node(args).holds_factory)) refuse_dict_class_use();
    drop_since(cls.start, "}");
    push(make(Kind::dict_object, 1), cls.start);
  }

  // An OrderedDict's attributes (a state_dict's `_metadata`: module versions that only Python's
  // load_state_dict reads) are dropped with the BUILD that would set them.
  void build() {
    const Item state = pop();
    if (node(top()).kind != Kind::dict_object) malformed("BUILD sets the attributes of something not an OrderedDict");
    drop_since(state.start, "");
  }

  void stop() {
    if (stack_.size() != 1 || !marks_.empty()) malformed("STOP leaves other than one value on the stack");
    refuse_factory(pop());
    stop_at_ = pos_;
    stopped_ = true;
  }

  void step() {
    op_at_ = pos_;
    const unsigned char op = static_cast<unsigned char>(read(1));
    switch (op) {
      case MARK: marks_.push_back(stack_.size()); return push(-1, op_at_);
      case NONE: return push_scalar(Kind::none);
      case NEWTRUE: case NEWFALSE: return push_scalar(Kind::scalar);
      case BININT1: read(1); return push_scalar(Kind::scalar);
      case BININT2: read(2); return push_scalar(Kind::scalar);
      case BININT: read(4); return push_scalar(Kind::scalar);
      case BINFLOAT: read(8); return push_scalar(Kind::scalar);
      case BINUNICODE: skip(read(4)); return push_scalar(Kind::scalar);
      case LONG1: return long1();
      case EMPTY_TUPLE: return make_tuple({});
      case TUPLE1: case TUPLE2: case TUPLE3: return tuple_of(op - TUPLE1 + 1);
      case TUPLE: return make_tuple(pop_to_mark());
      case EMPTY_LIST: return push_new(Kind::list, 1);
      case EMPTY_DICT: return push_new(Kind::dict, 1);
      case APPEND: return single_item(1, APPENDS);
      case SETITEM: return single_item(2, SETITEMS);
      case APPENDS: return add_items(pop_to_mark());
      case SETITEMS: return set_items(pop_to_mark());
      case BINPUT: return put(read(1));
      case LONG_BINPUT: return put(read(4));
      case BINGET: return get(read(1));
      case LONG_BINGET: return get(read(4));
      case GLOBAL: return global();
      case REDUCE: return reduce();
      case NEWOBJ: return newobj();
      case BUILD: return build();
      case BINPERSID: { const Item id = pop(); return push(make(Kind::object), id.start); }
      case STOP: return stop();
      default: break;
    }
    refuse("uses pickle opcode 0x" + hex(op) + " (at byte " + std::to_string(op_at_) + "), which torch.save does not "
           "write for tensors, numbers, strings, lists and dicts. Save those, e.g. torch.save(model.state_dict(), path)");
  }

  static std::string hex(unsigned char byte) {
    const char* digits = "0123456789abcdef";
    return {digits[byte >> 4], digits[byte & 15]};
  }

  std::vector<char> apply_edits() {
    std::stable_sort(edits_.begin(), edits_.end(), [](const Edit& a, const Edit& b) {
      return std::make_tuple(a.begin, a.end) < std::make_tuple(b.begin, b.end);
    });
    std::vector<char> out;
    out.reserve(stop_at_ + edits_.size());
    uint64_t cursor = 0;
    for (const auto& edit : edits_) {
      if (edit.begin < cursor) malformed("its opcodes overlap in a way no pickler writes");
      out.insert(out.end(), data_ + cursor, data_ + edit.begin);
      out.insert(out.end(), edit.bytes.begin(), edit.bytes.end());
      cursor = edit.end;
    }
    out.insert(out.end(), data_ + cursor, data_ + stop_at_);
    return out;
  }

  const unsigned char* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
  uint64_t op_at_ = 0;
  uint64_t stop_at_ = 0;
  bool stopped_ = false;
  std::vector<Node> nodes_;
  std::vector<Item> stack_;  // node -1: a MARK
  std::vector<std::size_t> marks_;
  std::vector<MemoEntry> memo_;
  std::vector<Edit> edits_;
  std::vector<std::pair<uint64_t, uint64_t>> dropped_;  // sorted, disjoint
};

}  // namespace

PickleRewrite rewrite_torch_pickle(const char* data, std::size_t size) {
  PickleRewrite result;
  try {
    result.pickle = Rewriter(data, size).run();
  } catch (const Refusal& refusal) {
    result.problem = refusal.what();
    result.damaged = refusal.damaged;
  }
  return result;
}

}  // namespace detail
}  // namespace checkpoint
}  // namespace lockstep
