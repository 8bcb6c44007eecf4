#pragma once
// Reading a torch.save zip archive (Python's, or LibTorch's torch::pickle_save and Lockstep's) with
// LibTorch's own unpickler, after rewrite_torch_pickle has made its pickle readable and safe.

#include <string>
#include <vector>

#include <ATen/core/ivalue.h>

#include "atomic_file.h"

namespace lockstep {
namespace checkpoint {
namespace detail {

struct TorchFile {
  c10::IValue value;     ///< what torch.save saved, when `problem` is empty
  std::string problem;   ///< damaged: why ("a tensor storage claims ..."); else a clause ("holds a pickled ...")
  bool damaged = false;  ///< malformed rather than content Lockstep refuses
};

/// The value in `bytes` (a zip archive that check_zip accepted). Every tensor is loaded onto the
/// CPU (as torch.load(map_location="cpu")) and checked to lie inside the record that holds its
/// storage, so that no tensor of a lying file reads past its bytes.
TorchFile read_torch_file(const std::vector<char>& bytes);

/// `value` as a torch.save zip archive (archive/data.pkl in protocol 2, archive/data/<N> per
/// storage), which Python's torch.load reads with weights_only=True; lists and dicts untyped.
/// The archive goes to `write` as it is made: each tensor's bytes straight from its storage, no
/// copy of the whole in memory. Returns the bytes written.
std::size_t torch_save(const c10::IValue& value, const WriteBytes& write);
/// torch_save into memory.
std::vector<char> torch_save_bytes(const c10::IValue& value);

/// `tensor`'s elements in a storage of their own, as torch.save writes a tensor's whole storage:
/// `tensor` itself when its storage holds only its elements, else a tensor over the same memory
/// whose storage is just those bytes (no copy; it keeps `tensor`'s memory alive). Contiguous
/// first, where it is not.
at::Tensor in_own_storage(const at::Tensor& tensor);

}  // namespace detail
}  // namespace checkpoint
}  // namespace lockstep
