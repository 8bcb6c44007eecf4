#include <lockstep/checkpoint/hyper_parameters.h>

#include <limits>
#include <sstream>

#include <lockstep/core/error.h>

namespace lockstep {
namespace checkpoint {

c10::IValue hyper_parameters_value(const nlohmann::json& hparams) {
  switch (hparams.type()) {
    case nlohmann::json::value_t::null: return c10::IValue();
    case nlohmann::json::value_t::boolean: return hparams.get<bool>();
    case nlohmann::json::value_t::number_integer: return hparams.get<int64_t>();
    case nlohmann::json::value_t::number_unsigned: {
      const auto n = hparams.get<uint64_t>();
      // torch.load has no unsigned 64-bit integer: the largest ones become floats.
      if (n > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return static_cast<double>(n);
      return static_cast<int64_t>(n);
    }
    case nlohmann::json::value_t::number_float: return hparams.get<double>();
    case nlohmann::json::value_t::string: return hparams.get<std::string>();
    case nlohmann::json::value_t::array: {
      c10::impl::GenericList list(c10::AnyType::get());
      for (const auto& item : hparams) list.push_back(hyper_parameters_value(item));
      return list;
    }
    case nlohmann::json::value_t::object: {
      c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
      for (const auto& [key, item] : hparams.items()) dict.insert(key, hyper_parameters_value(item));
      return dict;
    }
    default:
      throw UsageError("hparams() holds a JSON " + std::string(hparams.type_name()) +
                       " value, which a checkpoint cannot carry: use numbers, bools, strings, lists and objects.");
  }
}

namespace {

std::string described(const c10::IValue& value) {
  std::ostringstream text;
  if (value.isTensor()) {
    const auto& t = value.toTensor();
    text << "tensor of shape " << t.sizes() << " (" << t.scalar_type() << ")";
  } else {
    text << value.tagKind();
  }
  return text.str();
}

}  // namespace

nlohmann::json hyper_parameters_json(const c10::IValue& value) {
  if (value.isNone()) return nullptr;
  if (value.isBool()) return value.toBool();
  if (value.isInt()) return value.toInt();
  if (value.isDouble()) return value.toDouble();
  if (value.isString()) return value.toStringRef();
  if (value.isList() || value.isTuple()) {
    nlohmann::json array = nlohmann::json::array();
    const auto items = value.isList() ? value.toListRef().vec() : value.toTupleRef().elements().vec();
    for (const auto& item : items) array.push_back(hyper_parameters_json(item));
    return array;
  }
  if (value.isGenericDict()) {
    nlohmann::json object = nlohmann::json::object();
    for (const auto& entry : value.toGenericDict()) {
      const auto& key = entry.key();
      object[key.isString() ? key.toStringRef() : hyper_parameters_json(key).dump()] = hyper_parameters_json(entry.value());
    }
    return object;
  }
  if (value.isTensor() && value.toTensor().numel() == 1) {
    const auto& t = value.toTensor();
    if (t.is_floating_point()) return t.item<double>();
    if (t.scalar_type() == at::kBool) return t.item<bool>();
    return t.item<int64_t>();
  }
  return described(value);
}

nlohmann::json hparams_of(const Checkpoint& checkpoint) {
  if (!checkpoint.contains("hyper_parameters")) return nlohmann::json::object();
  auto hparams = hyper_parameters_json(checkpoint.at("hyper_parameters"));
  return hparams.is_object() ? hparams : nlohmann::json{{"hyper_parameters", hparams}};
}

}  // namespace checkpoint
}  // namespace lockstep
