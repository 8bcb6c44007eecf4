#pragma once
/// The tensors in what a module's forward returns: tensors, and vectors, arrays, tuples, pairs,
/// maps, optionals and IValues of them. DistributedDataParallel arms its reduction from them, and
/// find_unused_parameters walks the graph back from them.

#include <array>
#include <map>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Optional.h>
#include <torch/ordered_dict.h>

namespace lockstep {
namespace distributed {

namespace detail {

// Finds the tensors in a forward's outputs: tensors, and vectors, arrays, tuples, pairs, maps,
// optionals and IValues of them. `collect` returns false for a type it cannot look into.
template <typename T, typename = void>
struct OutputTensors {
  static bool collect(const T&, std::vector<at::Tensor>&) { return false; }
};
template <>
struct OutputTensors<at::Tensor> {
  static bool collect(const at::Tensor& t, std::vector<at::Tensor>& out) {
    out.push_back(t);
    return true;
  }
};
template <>
struct OutputTensors<c10::IValue> {
  static bool collect(const c10::IValue& v, std::vector<at::Tensor>& out) {
    if (v.isTensor()) {
      out.push_back(v.toTensor());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorVector()) out.push_back(t);
    } else if (v.isList()) {
      for (const c10::IValue& e : v.toListRef()) collect(e, out);
    } else if (v.isTuple()) {
      for (const c10::IValue& e : v.toTupleRef().elements()) collect(e, out);
    } else if (v.isGenericDict()) {
      for (const auto& e : v.toGenericDict()) collect(e.value(), out);
    }
    return true;
  }
};
template <typename T>
struct OutputTensors<std::vector<T>> {
  static bool collect(const std::vector<T>& v, std::vector<at::Tensor>& out) {
    bool known = true;
    for (const auto& e : v) known = OutputTensors<T>::collect(e, out) && known;
    return known;
  }
};
template <typename T, size_t N>
struct OutputTensors<std::array<T, N>> {
  static bool collect(const std::array<T, N>& v, std::vector<at::Tensor>& out) {
    bool known = true;
    for (const auto& e : v) known = OutputTensors<T>::collect(e, out) && known;
    return known;
  }
};
template <typename... T>
struct OutputTensors<std::tuple<T...>> {
  static bool collect(const std::tuple<T...>& v, std::vector<at::Tensor>& out) {
    return std::apply([&](const auto&... e) { return (true && ... && OutputTensors<std::decay_t<decltype(e)>>::collect(e, out)); }, v);
  }
};
template <typename A, typename B>
struct OutputTensors<std::pair<A, B>> {
  static bool collect(const std::pair<A, B>& v, std::vector<at::Tensor>& out) {
    const bool a = OutputTensors<A>::collect(v.first, out);
    return OutputTensors<B>::collect(v.second, out) && a;
  }
};
template <typename K, typename V>
struct OutputTensors<std::map<K, V>> {
  static bool collect(const std::map<K, V>& v, std::vector<at::Tensor>& out) {
    bool known = true;
    for (const auto& e : v) known = OutputTensors<V>::collect(e.second, out) && known;
    return known;
  }
};
template <typename K, typename V>
struct OutputTensors<std::unordered_map<K, V>> {
  static bool collect(const std::unordered_map<K, V>& v, std::vector<at::Tensor>& out) {
    bool known = true;
    for (const auto& e : v) known = OutputTensors<V>::collect(e.second, out) && known;
    return known;
  }
};
template <typename K, typename V>
struct OutputTensors<torch::OrderedDict<K, V>> {
  static bool collect(const torch::OrderedDict<K, V>& v, std::vector<at::Tensor>& out) {
    bool known = true;
    for (const auto& e : v) known = OutputTensors<V>::collect(e.value(), out) && known;
    return known;
  }
};
template <typename T>
struct OutputTensors<c10::optional<T>> {
  static bool collect(const c10::optional<T>& v, std::vector<at::Tensor>& out) {
    return !v || OutputTensors<T>::collect(*v, out);
  }
};

}  // namespace detail

/// Appends the tensors of `outputs` to `tensors`; false when its type (or a part's) is none of
/// the above, so some may be missing.
template <typename Outputs>
bool output_tensors(const Outputs& outputs, std::vector<at::Tensor>& tensors) {
  return detail::OutputTensors<std::decay_t<Outputs>>::collect(outputs, tensors);
}

}  // namespace distributed
}  // namespace lockstep
