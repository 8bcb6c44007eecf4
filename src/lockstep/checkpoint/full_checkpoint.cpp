// The full checkpoint from a sharded one: each piece key's tensor put at its path.

#include <lockstep/checkpoint/sharded_checkpoint.h>

#include <algorithm>
#include <string>
#include <vector>

#include <torch/torch.h>

#include <lockstep/core/error.h>

#include "sharded_format.h"

namespace lockstep {
namespace checkpoint {
namespace {

using Dict = c10::impl::GenericDict;

// Copies of every list and dict in `value` (elements typed Any), so that inserting into them
// leaves the caller's containers as they were; tensors are shared.
c10::IValue copy_containers(const c10::IValue& value) {
  if (value.isList()) {
    c10::impl::GenericList out(c10::AnyType::get());
    for (const auto& item : value.toListRef()) out.push_back(copy_containers(item));
    return out;
  }
  if (value.isGenericDict()) {
    Dict out(c10::AnyType::get(), c10::AnyType::get());
    for (const auto& entry : value.toGenericDict()) out.insert(entry.key(), copy_containers(entry.value()));
    return out;
  }
  return value;
}

bool is_index(const std::string& name) {
  return !name.empty() && name.size() < 18 &&
         std::all_of(name.begin(), name.end(), [](char c) { return c >= '0' && c <= '9'; });
}

Dict new_dict() { return Dict(c10::AnyType::get(), c10::AnyType::get()); }

// "a list", "a dict", "a Tensor", "an int": what a value is, in words the same in LibTorch 1.x and 2.x.
std::string kind_of(const c10::IValue& value) {
  if (value.isList()) return "a list";
  if (value.isGenericDict()) return "a dict";
  const std::string type = value.type()->str();
  return (std::string("aeiou").find(type[0]) == std::string::npos ? "a " : "an ") + type;
}

// Puts `tensor` at path[level..] below `node` (a list or a dict), creating missing levels.
void put_tensor(const c10::IValue& node, const std::vector<std::string>& path, std::size_t level,
                const at::Tensor& tensor, const std::string& key) {
  const std::string& name = path[level];
  const bool last = level + 1 == path.size();
  const auto refuse = [&](const std::string& why) {
    throw UsageError("to_full_checkpoint: the tensor \"" + key + "\" cannot be placed: " + why +
                     ". Give pieces keys whose path ends where the full checkpoint holds a tensor, and leave that "
                     "entry out of the common dict (or make it a tensor or None there).");
  };
  if (node.isList()) {
    auto list = node.toList();
    if (!is_index(name) || std::stoll(name) > static_cast<long long>(list.size())) {
      refuse("\"" + name + "\" is not an index into the list of " + std::to_string(list.size()) + " entries there");
    }
    const auto index = static_cast<std::size_t>(std::stoll(name));
    if (index == list.size()) list.push_back(last ? c10::IValue(tensor) : c10::IValue(new_dict()));
    const c10::IValue child = list.get(index);
    if (last) {
      if (!child.isTensor() && !child.isNone()) refuse("the common dict holds " + kind_of(child) + " there");
      list.set(index, tensor);
      return;
    }
    put_tensor(child, path, level + 1, tensor, key);
    return;
  }
  if (!node.isGenericDict()) refuse("\"" + path[level - 1] + "\" is " + kind_of(node) + ", not a dict or a list");
  auto dict = node.toGenericDict();
  c10::IValue name_key(name);
  if (!dict.contains(name_key) && is_index(name) && dict.keyType()->kind() != c10::TypeKind::StringType) {
    name_key = c10::IValue(static_cast<int64_t>(std::stoll(name)));
  }
  const auto found = dict.find(name_key);
  if (last) {
    if (found != dict.end() && !found->value().isTensor() && !found->value().isNone()) {
      refuse("the common dict holds " + kind_of(found->value()) + " there");
    }
    dict.insert_or_assign(name_key, tensor);
    return;
  }
  if (found == dict.end()) dict.insert(name_key, new_dict());
  put_tensor(dict.at(name_key), path, level + 1, tensor, key);
}

}  // namespace

Checkpoint to_full_checkpoint(const Checkpoint& common, const std::map<std::string, at::Tensor>& tensors) {
  Checkpoint out = make_checkpoint();
  for (const auto& entry : common) out.insert(entry.key(), copy_containers(entry.value()));
  for (const auto& [key, tensor] : tensors) {
    put_tensor(out, detail::split_piece_key(key, "to_full_checkpoint"), 0, tensor, key);
  }
  return out;
}

Checkpoint to_full_checkpoint(const ReassembledCheckpoint& checkpoint) {
  return to_full_checkpoint(checkpoint.common, checkpoint.tensors);
}

}  // namespace checkpoint
}  // namespace lockstep
