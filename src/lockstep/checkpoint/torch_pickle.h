#pragma once
// The pickle (data.pkl) of a torch.save file, made readable by LibTorch's unpickler. Python writes
// opcodes that LibTorch 1.13 lacks (SETITEM, APPEND, LONG1 shorter than 8 bytes) and an
// OrderedDict for every state_dict, which LibTorch turns into None; the rewrite replaces those
// with equivalents it reads, and refuses what it must not run (a pickled class, a malformed
// stream), so that the unpickler only ever sees a well-formed stream of dicts, lists, tuples,
// scalars and tensors.

#include <cstddef>
#include <string>
#include <vector>

namespace lockstep {
namespace checkpoint {
namespace detail {

struct PickleRewrite {
  std::vector<char> pickle;  ///< the stream to unpickle, when `problem` is empty
  std::string problem;       ///< damaged: why ("its pickle ... is malformed: ..."); else a clause ("holds a pickled ...")
  bool damaged = false;      ///< malformed (a cut or corrupt file) rather than content Lockstep refuses
};

/// Rewrites the pickle `data` (protocol 2, as torch.save and LibTorch's pickler write it):
/// - `collections.OrderedDict()` becomes an empty dict, and the attributes an OrderedDict
///   carries (a state_dict's `_metadata`) are dropped; so do `collections.defaultdict(T)` (its
///   default factory T, a builtin type, dropped) and Lightning's `AttributeDict` (a dict subclass
///   that Lightning checkpoints hold their hyper_parameters in, pickled with NEWOBJ);
/// - SETITEM and APPEND become MARK ... SETITEMS / APPENDS; a LONG1 integer becomes 8 bytes wide;
/// - any class or function other than tensor rebuilding (torch._utils._rebuild_tensor_v2, the
///   storage types, torch.device, torch.jit._pickle) is refused, naming it;
/// - every read is bounded by `size`, the stack and memo are checked as a pickle machine would,
///   containers nest at most 100 deep and a container is not filled once referenced again.
PickleRewrite rewrite_torch_pickle(const char* data, std::size_t size);

}  // namespace detail
}  // namespace checkpoint
}  // namespace lockstep
