#include <lockstep/checkpoint/optimizer_state.h>

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <typeinfo>
#include <utility>

#include <torch/torch.h>

#include <lockstep/core/error.h>
#include <lockstep/core/libtorch_compat.h>

namespace lockstep {
namespace checkpoint {
namespace {

using Dict = c10::impl::GenericDict;
using torch::Tensor;

const char* const kMismatchHint =
    ". The checkpoint was saved with a different optimizer or model: configure the same optimizer type and "
    "parameter groups as the run that wrote it";

[[noreturn]] void mismatch(const std::string& what) { throw UsageError("optimizer state: " + what + kMismatchHint + "."); }

Dict string_dict() { return Dict(c10::StringType::get(), c10::AnyType::get()); }

using StateKey = libtorch::OptimizerStateKey<torch::optim::Optimizer>;
StateKey state_key(const Tensor& param) { return libtorch::optimizer_state_key<torch::optim::Optimizer>(param); }

const c10::IValue& field(const Dict& dict, const std::string& key, const std::string& where) {
  auto it = dict.find(key);
  if (it == dict.end()) mismatch(where + " lacks \"" + key + "\"");
  return it->value();
}

double number(const Dict& dict, const std::string& key, const std::string& where) {
  const auto& value = field(dict, key, where);
  if (value.isDouble()) return value.toDouble();
  if (value.isInt()) return static_cast<double>(value.toInt());
  mismatch(where + "[\"" + key + "\"] is a " + value.type()->str() + ", not a number");
}

bool boolean(const Dict& dict, const std::string& key, const std::string& where) {
  const auto& value = field(dict, key, where);
  if (!value.isBool()) mismatch(where + "[\"" + key + "\"] is a " + value.type()->str() + ", not a bool");
  return value.toBool();
}

Tensor tensor_like(const Dict& dict, const std::string& key, const Tensor& param, const std::string& where) {
  const auto& value = field(dict, key, where);
  if (!value.isTensor()) mismatch(where + "[\"" + key + "\"] is a " + value.type()->str() + ", not a tensor");
  const Tensor t = value.toTensor();
  if (t.sizes() != param.sizes()) {
    mismatch(where + "[\"" + key + "\"] has shape " + c10::str(t.sizes()) + " but its parameter has shape " +
             c10::str(param.sizes()));
  }
  return t.to(param.device(), param.scalar_type());  // as it is when it matches: PyTorch's load_state_dict
}

// --- per optimizer: its options and per-parameter state in Python's names ---------------------

struct SgdLayout {
  using Options = torch::optim::SGDOptions;
  using State = torch::optim::SGDParamState;

  static void write_options(const Options& o, Dict& group) {
    group.insert("lr", o.lr());
    group.insert("momentum", o.momentum());
    group.insert("dampening", o.dampening());
    group.insert("weight_decay", o.weight_decay());
    group.insert("nesterov", o.nesterov());
    group.insert("maximize", false);
    group.insert("foreach", c10::IValue());
    group.insert("differentiable", false);
  }
  static void read_options(const Dict& group, const std::string& where, Options& o) {
    o.lr(number(group, "lr", where));
    o.momentum(number(group, "momentum", where));
    o.dampening(number(group, "dampening", where));
    o.weight_decay(number(group, "weight_decay", where));
    o.nesterov(boolean(group, "nesterov", where));
  }
  static void write_state(const State& s, Dict& out) {
    if (s.momentum_buffer().defined()) out.insert("momentum_buffer", s.momentum_buffer());
  }
  static std::unique_ptr<State> read_state(const Dict& in, const Tensor& param, const std::string& where) {
    auto state = std::make_unique<State>();
    const auto it = in.find("momentum_buffer");
    if (it != in.end() && !it->value().isNone()) state->momentum_buffer(tensor_like(in, "momentum_buffer", param, where));
    return state;
  }
};

template <typename OptionsT, typename StateT>
struct AdamLayout {
  using Options = OptionsT;
  using State = StateT;

  static void write_options(const Options& o, Dict& group) {
    group.insert("lr", o.lr());
    group.insert("betas", c10::ivalue::Tuple::create({std::get<0>(o.betas()), std::get<1>(o.betas())}));
    group.insert("eps", o.eps());
    group.insert("weight_decay", o.weight_decay());
    group.insert("amsgrad", o.amsgrad());
    group.insert("maximize", false);
    group.insert("foreach", c10::IValue());
    group.insert("capturable", false);
    group.insert("differentiable", false);
    group.insert("fused", false);
  }
  static void read_options(const Dict& group, const std::string& where, Options& o) {
    o.lr(number(group, "lr", where));
    const auto& betas = field(group, "betas", where);
    const bool pair = (betas.isTuple() && betas.toTupleRef().elements().size() == 2) ||
                      (betas.isList() && betas.toListRef().size() == 2);
    if (!pair) mismatch(where + "[\"betas\"] is a " + betas.type()->str() + ", not a pair of numbers");
    const auto& b = betas.isTuple() ? betas.toTupleRef().elements().vec() : betas.toListRef().vec();
    if (!b[0].isScalar() || !b[1].isScalar()) mismatch(where + "[\"betas\"] holds non-numbers");
    o.betas(std::make_tuple(b[0].toScalar().toDouble(), b[1].toScalar().toDouble()));
    o.eps(number(group, "eps", where));
    o.weight_decay(number(group, "weight_decay", where));
    o.amsgrad(boolean(group, "amsgrad", where));
  }
  static void write_state(const State& s, Dict& out) {
    // Python keeps step as a scalar tensor; float64 holds every step count exactly.
    out.insert("step", torch::tensor(static_cast<double>(s.step()), torch::kFloat64));
    if (s.exp_avg().defined()) out.insert("exp_avg", s.exp_avg());
    if (s.exp_avg_sq().defined()) out.insert("exp_avg_sq", s.exp_avg_sq());
    if (s.max_exp_avg_sq().defined()) out.insert("max_exp_avg_sq", s.max_exp_avg_sq());
  }
  static std::unique_ptr<State> read_state(const Dict& in, const Tensor& param, const std::string& where) {
    auto state = std::make_unique<State>();
    const auto& step = field(in, "step", where);
    double value = 0;
    if (step.isTensor() && step.toTensor().numel() == 1) {
      value = step.toTensor().item<double>();
    } else if (step.isInt() || step.isDouble()) {
      value = step.toScalar().toDouble();
    } else {
      mismatch(where + "[\"step\"] is a " + step.type()->str() + ", not a step count");
    }
    if (value < 0 || value != std::floor(value)) mismatch(where + "[\"step\"] is " + std::to_string(value) + ", not a count");
    state->step(static_cast<int64_t>(value));
    state->exp_avg(tensor_like(in, "exp_avg", param, where));
    state->exp_avg_sq(tensor_like(in, "exp_avg_sq", param, where));
    if (in.contains("max_exp_avg_sq")) state->max_exp_avg_sq(tensor_like(in, "max_exp_avg_sq", param, where));
    return state;
  }
};

using AdamState = AdamLayout<torch::optim::AdamOptions, torch::optim::AdamParamState>;
using AdamWState = AdamLayout<torch::optim::AdamWOptions, torch::optim::AdamWParamState>;

template <typename Layout>
Dict save(const torch::optim::Optimizer& optimizer) {
  Dict state(c10::IntType::get(), c10::AnyType::get());
  c10::impl::GenericList groups(c10::AnyType::get());
  int64_t index = 0;
  for (const auto& group : optimizer.param_groups()) {
    Dict saved = string_dict();
    Layout::write_options(static_cast<const typename Layout::Options&>(group.options()), saved);
    std::vector<int64_t> indices;
    for (const auto& param : group.params()) {
      const auto it = optimizer.state().find(state_key(param));
      if (it != optimizer.state().end()) {
        Dict param_state = string_dict();
        Layout::write_state(static_cast<const typename Layout::State&>(*it->second), param_state);
        state.insert(index, param_state);
      }
      indices.push_back(index++);
    }
    saved.insert("params", indices);
    groups.push_back(saved);
  }
  Dict out = string_dict();
  out.insert("state", state);
  out.insert("param_groups", groups);
  return out;
}

Dict as_dict(const c10::IValue& value, const std::string& where) {
  if (!value.isGenericDict()) mismatch(where + " is a " + value.type()->str() + ", not a dict");
  return value.toGenericDict();
}

// Everything is parsed and checked before the optimizer changes, so a mismatch leaves it intact.
template <typename Layout>
void load(torch::optim::Optimizer& optimizer, const Dict& in) {
  const auto& groups_value = field(in, "param_groups", "the dict");
  if (!groups_value.isList()) mismatch("\"param_groups\" is a " + groups_value.type()->str() + ", not a list");
  const auto groups = groups_value.toListRef();
  const Dict saved_state = as_dict(field(in, "state", "the dict"), "\"state\"");
  auto& current = optimizer.param_groups();
  if (groups.size() != current.size()) {
    mismatch("the checkpoint has " + std::to_string(groups.size()) + " parameter groups, the optimizer " +
             std::to_string(current.size()));
  }
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> options;
  std::map<int64_t, Tensor> param_of_id;  // Python maps saved ids to parameters by position.
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::string where = "param_groups[" + std::to_string(g) + "]";
    const Dict group = as_dict(groups[g], where);
    auto parsed = current[g].options().clone();
    Layout::read_options(group, where, static_cast<typename Layout::Options&>(*parsed));
    options.push_back(std::move(parsed));
    const auto& ids = field(group, "params", where);
    if (!ids.isList()) mismatch(where + "[\"params\"] is not a list");
    const auto id_list = ids.toListRef();
    if (id_list.size() != current[g].params().size()) {
      mismatch(where + " has " + std::to_string(id_list.size()) + " parameters in the checkpoint and " +
               std::to_string(current[g].params().size()) + " in the optimizer");
    }
    for (size_t i = 0; i < id_list.size(); ++i) {
      if (!id_list[i].isInt()) mismatch(where + "[\"params\"] holds a non-integer");
      param_of_id[id_list[i].toInt()] = current[g].params()[i];
    }
  }
  std::vector<std::pair<StateKey, std::unique_ptr<typename Layout::State>>> states;
  for (const auto& entry : saved_state) {
    const std::string where = "state[" + (entry.key().isInt() ? std::to_string(entry.key().toInt()) : "?") + "]";
    const auto it = entry.key().isInt() ? param_of_id.find(entry.key().toInt()) : param_of_id.end();
    if (it == param_of_id.end()) mismatch(where + " belongs to no parameter of \"param_groups\"");
    states.emplace_back(state_key(it->second), Layout::read_state(as_dict(entry.value(), where), it->second, where));
  }
  for (size_t g = 0; g < current.size(); ++g) current[g].set_options(std::move(options[g]));
  optimizer.state().clear();
  for (auto& [key, state] : states) optimizer.state()[key] = std::move(state);
}

[[noreturn]] void unsupported(const torch::optim::Optimizer& optimizer) {
  throw UsageError(std::string("optimizer state: ") + c10::demangle(typeid(optimizer).name()) +
                   " is not supported; lockstep::checkpoint saves and restores torch::optim::SGD, Adam and AdamW. "
                   "Use one of those, or store this optimizer's state in the checkpoint yourself.");
}

}  // namespace

c10::impl::GenericDict optimizer_state_dict(const torch::optim::Optimizer& optimizer) {
  if (dynamic_cast<const torch::optim::SGD*>(&optimizer)) return save<SgdLayout>(optimizer);
  if (dynamic_cast<const torch::optim::Adam*>(&optimizer)) return save<AdamState>(optimizer);
  if (dynamic_cast<const torch::optim::AdamW*>(&optimizer)) return save<AdamWState>(optimizer);
  unsupported(optimizer);
}

void load_optimizer_state_dict(torch::optim::Optimizer& optimizer, const c10::impl::GenericDict& state) {
  const std::string prefix = "optimizer state: ";
  try {
    if (dynamic_cast<torch::optim::SGD*>(&optimizer)) return load<SgdLayout>(optimizer, state);
    if (dynamic_cast<torch::optim::Adam*>(&optimizer)) return load<AdamState>(optimizer, state);
    if (dynamic_cast<torch::optim::AdamW*>(&optimizer)) return load<AdamWState>(optimizer, state);
  } catch (const UsageError& e) {
    // Say which optimizer was being restored, the half of the mismatch the dict cannot tell.
    const std::string message = message_of(e);
    throw UsageError("optimizer state for " + c10::demangle(typeid(optimizer).name()) + ": " +
                     message.substr(message.rfind(prefix, 0) == 0 ? prefix.size() : 0));
  }
  unsupported(optimizer);
}

}  // namespace checkpoint
}  // namespace lockstep
