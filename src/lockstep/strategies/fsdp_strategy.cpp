#include <lockstep/strategies/fsdp_strategy.h>

#include <algorithm>
#include <cctype>
#include <functional>
#include <set>
#include <unordered_map>

#include <torch/optim/lbfgs.h>

#include <lockstep/checkpoint/dcp_checkpoint.h>
#include <lockstep/checkpoint/optimizer_state.h>
#include <lockstep/checkpoint/state_dict.h>
#include <lockstep/core/error.h>
#include <lockstep/core/heap.h>
#include <lockstep/core/training_module.h>
#include <lockstep/strategies/registry.h>

namespace lockstep {
namespace strategies {
namespace {

// One name per sharding, as Lightning registers fsdp_cpu_offload: --strategy fsdp_hybrid_shard.
const bool fsdp_registered = [] {
  using distributed::ShardingStrategy;
  const auto add = [](const std::string& name, ShardingStrategy sharding, const std::string& description) {
    register_strategy(
        name,
        [name, sharding] {
          return std::make_shared<FSDPStrategy>(distributed::ShardingOptions().sharding_strategy(sharding),
                                                StateDictType::full, name);
        },
        description);
  };
  add("fsdp", ShardingStrategy::full_shard,
      "sharded data parallel (FULL_SHARD): parameters, gradients and optimizer state split over the ranks");
  add("fsdp_shard_grad_op", ShardingStrategy::shard_grad_op,
      "fsdp with SHARD_GRAD_OP (ZeRO-2): gradients and optimizer state split, parameters whole");
  add("fsdp_shard_optimizer_state", ShardingStrategy::shard_optimizer_state,
      "fsdp with SHARD_OPTIMIZER_STATE (ZeRO-1): the optimizer state split");
  add("fsdp_hybrid_shard", ShardingStrategy::hybrid_shard,
      "fsdp with HYBRID_SHARD: FULL_SHARD within each node, the nodes replicas");
  add("fsdp_no_shard", ShardingStrategy::no_shard, "fsdp with NO_SHARD: nothing split, as ddp");
  return true;
}();

// Fabric's view of one FullyShardedDataParallel.
class FSDPModule : public WrappedModule {
 public:
  explicit FSDPModule(std::shared_ptr<distributed::FullyShardedDataParallelBase> fsdp) : fsdp_(std::move(fsdp)) {}
  void before_forward() override { fsdp_->prepare_forward(); }

 private:
  std::shared_ptr<distributed::FullyShardedDataParallelBase> fsdp_;
};

// A checkpoint's callback states without the weights laid out like the module's ("state_dict" in
// a state, as weight averaging keeps its average), which `add` takes as pieces under
// "callbacks/<name>/state_dict/<parameter or buffer>".
c10::impl::GenericDict weights_as_pieces(const c10::impl::GenericDict& callbacks,
                                         const std::function<void(const std::string&, const torch::Tensor&)>& add) {
  auto common = callbacks.copy();
  for (const auto& entry : callbacks) {
    if (!entry.value().isGenericDict() || !entry.value().toGenericDict().contains("state_dict")) continue;
    auto state = entry.value().toGenericDict().copy();
    for (const auto& tensor : state.at("state_dict").toGenericDict()) {
      add("callbacks/" + entry.key().toStringRef() + "/state_dict/" + tensor.key().toStringRef(),
          tensor.value().toTensor());
    }
    (void)state.erase("state_dict");
    common.insert_or_assign(entry.key(), state);
  }
  return common;
}

// Optimizer state that has one value per element of its parameter (not "step").
bool is_per_element(const std::string& key) { return key != "step"; }

std::vector<torch::Tensor> parameters_of(const torch::optim::Optimizer& optimizer) {
  std::vector<torch::Tensor> params;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) params.push_back(p);
  }
  return params;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

}  // namespace

StateDictType parse_state_dict_type(const std::string& name) {
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  if (lower == "full") return StateDictType::full;
  if (lower == "sharded") return StateDictType::sharded;
  if (lower == "dcp") return StateDictType::dcp;
  throw UsageError("unknown state dict type '" + name + "'; use full (one file, whole tensors), sharded (a "
                   "directory of each rank's pieces) or dcp (the same in torch.distributed.checkpoint's format).");
}

FSDPStrategy::FSDPStrategy(distributed::ShardingOptions options, StateDictType state_dict_type, std::string name)
    : ParallelStrategy("popen", std::move(name)),
      options_(std::move(options)),
      state_dict_type_(state_dict_type) {}

void FSDPStrategy::set_context(const StrategyContext& context) {
  LOCKSTEP_CHECK(options_.param_dtype() != at::kHalf || context.accelerator == accelerators::Accelerator::cuda,
                 UsageError, "--strategy ", name(), ": param_dtype float16 (--fsdp-param-dtype 16) computes in "
                 "float16, which LibTorch's CPU matmuls lack, and the accelerator is ",
                 accelerators::to_string(context.accelerator), ". Use --fsdp-param-dtype bf16, or --accelerator "
                 "cuda (in code: ShardingOptions().param_dtype(at::kBFloat16)).");
  ParallelStrategy::set_context(context);
}

std::shared_ptr<WrappedModule> FSDPStrategy::setup_module(const std::shared_ptr<torch::nn::Module>& module) {
  LOCKSTEP_CHECK(!context_.sync_batchnorm, UsageError,
                 "--sync-batchnorm true is not available with --strategy fsdp yet; use --strategy ddp for it.");
  check_on_device(*module, device_ids());
  core::tune_heap_for_sharded_training();
  fsdp_ = std::make_shared<distributed::FullyShardedDataParallelBase>(module, process_group(), options_);
  all_.push_back(fsdp_);
  return std::make_shared<FSDPModule>(fsdp_);
}

void FSDPStrategy::teardown() {
  fsdp_.reset();
  all_.clear();
}

torch::Tensor FSDPStrategy::training_step(TrainingModule& module, Batch& batch, int64_t batch_idx) {
  fsdp_->prepare_forward();
  return module.training_step(batch, batch_idx);
}

void FSDPStrategy::before_evaluation_step() {
  for (const auto& fsdp : all_) fsdp->prepare_forward();
}

distributed::FullyShardedDataParallelBase& FSDPStrategy::wrapper_of(const torch::Tensor& parameter,
                                                                     const std::string& what) const {
  for (const auto& fsdp : all_) {
    for (const auto& p : fsdp->parameters()) {
      if (p.unsafeGetTensorImpl() == parameter.unsafeGetTensorImpl()) return *fsdp;
    }
  }
  throw UsageError("--strategy fsdp: " + what +
                   " holds a parameter of no module set up with this strategy; set the module up first (Fabric: "
                   "setup(module, optimizer)) and give the optimizer its parameters.");
}

double FSDPStrategy::clip_grad_norm(const std::vector<torch::Tensor>& parameters, double max_norm, double norm_type) {
  LOCKSTEP_CHECK(!parameters.empty(), UsageError, "--strategy fsdp: clipping gradients of no parameters.");
  auto& fsdp = wrapper_of(parameters.front(), "the clipped parameters");
  LOCKSTEP_CHECK(parameters.size() == fsdp.parameters().size(), UsageError,
                 "--strategy fsdp clips the gradients of a whole module (", fsdp.parameters().size(),
                 " parameters), not of ", parameters.size(), " of them: give all of its parameters to one optimizer.");
  return fsdp.clip_grad_norm(max_norm, norm_type);
}

void FSDPStrategy::check_optimizer(const torch::optim::Optimizer& optimizer) const {
  LOCKSTEP_CHECK(dynamic_cast<const torch::optim::LBFGS*>(&optimizer) == nullptr, UsageError,
                 "--strategy fsdp cannot step LBFGS: it needs whole gradients and parameters on every rank, and "
                 "each rank holds a shard. Use SGD, Adam, AdamW, Adagrad or RMSprop, or --strategy ddp.");
  LOCKSTEP_CHECK(optimizer.state().empty(), UsageError,
                 "--strategy fsdp: the optimizer already has state for its parameters (it stepped, or loaded a "
                 "state), shaped for whole parameters; each rank now holds a shard. Set up the module before "
                 "the optimizer steps, and load checkpoints through the Trainer or Fabric.");
}

c10::Dict<std::string, torch::Tensor> FSDPStrategy::module_state_dict(const torch::nn::Module& module) {
  for (const auto& fsdp : all_) {
    if (fsdp->base_module().get() != &module) continue;
    if (saves_pieces()) {
      // This rank's pieces (1-D), for save_checkpoint; buffers as they are.
      auto state = checkpoint::state_dict(module);
      for (const auto& item : module.named_parameters()) state.insert_or_assign(item.key(), fsdp->local_piece(item.value()));
      return state;
    }
    std::unordered_map<std::string, torch::Tensor> whole;
    for (auto& item : fsdp->full_state_dict()) whole.emplace(item.first, item.second);
    auto state = checkpoint::state_dict(module);  // Python's order of names
    for (const auto& item : state) state.insert_or_assign(item.key(), whole.at(item.key()));
    return state;
  }
  return Strategy::module_state_dict(module);
}

std::vector<std::pair<std::string, torch::Tensor>> FSDPStrategy::local_weights(const torch::nn::Module& module) {
  auto* fsdp = wrapper_of(module);
  if (fsdp == nullptr) return Strategy::local_weights(module);
  auto weights = Strategy::local_weights(module);
  const auto params = module.named_parameters();
  for (auto& [name, tensor] : weights) {
    if (const auto* p = params.find(name)) tensor = fsdp->local_piece(*p);
  }
  return weights;
}

void FSDPStrategy::load_local_weights(torch::nn::Module& module, const std::map<std::string, torch::Tensor>& values) {
  auto* fsdp = wrapper_of(module);
  if (fsdp == nullptr) {
    Strategy::load_local_weights(module, values);
    return;
  }
  fsdp->load_local_pieces(values, /*strict=*/false);
}

distributed::FullyShardedDataParallelBase* FSDPStrategy::wrapper_of(const torch::nn::Module& module) const {
  for (const auto& fsdp : all_) {
    if (fsdp->base_module().get() == &module) return fsdp.get();
  }
  return nullptr;
}

c10::Dict<std::string, torch::Tensor> FSDPStrategy::whole_tensors(const torch::nn::Module& module,
                                                                  const std::function<bool(const std::string&)>& wanted) {
  auto* fsdp = wrapper_of(module);
  if (fsdp == nullptr) return Strategy::whole_tensors(module, wanted);
  std::unordered_map<std::string, torch::Tensor> whole;
  for (auto& item : fsdp->full_state_dict(wanted)) whole.emplace(item.first, item.second);
  c10::Dict<std::string, torch::Tensor> state;
  for (const auto& item : checkpoint::state_dict(module)) {  // Python's order of names
    if (whole.count(item.key())) state.insert(item.key(), whole.at(item.key()));
  }
  return state;
}

std::vector<std::pair<std::string, int64_t>> FSDPStrategy::whole_sizes(const torch::nn::Module& module) {
  auto* fsdp = wrapper_of(module);
  if (fsdp == nullptr) return Strategy::whole_sizes(module);
  std::unordered_map<std::string, torch::Tensor> parameters;
  for (const auto& item : module.named_parameters()) parameters.emplace(item.key(), item.value());
  std::vector<std::pair<std::string, int64_t>> sizes;
  for (const auto& item : checkpoint::state_dict(module)) {
    const auto p = parameters.find(item.key());
    const int64_t numel =
        p == parameters.end() ? item.value().numel() : c10::multiply_integers(fsdp->piece_info(p->second).shape);
    sizes.emplace_back(item.key(), numel * static_cast<int64_t>(item.value().element_size()));
  }
  return sizes;
}

void FSDPStrategy::load_module_state_dict(torch::nn::Module& module, const c10::impl::GenericDict& state,
                                          bool strict) {
  for (const auto& fsdp : all_) {
    if (fsdp->base_module().get() != &module) continue;
    // The state's tensors that the module has (with strict, no others).
    std::set<std::string> known;
    for (const auto& item : checkpoint::state_dict(module)) known.insert(item.key());
    std::vector<std::pair<std::string, torch::Tensor>> values;
    for (const auto& item : state) {
      const auto name = item.key().toStringRef();
      if (!known.count(name)) {
        LOCKSTEP_CHECK(!strict, UsageError, "the state has '", name, "', which the module does not.");
        continue;
      }
      LOCKSTEP_CHECK(item.value().isTensor(), UsageError, "the state's '", name, "' is not a tensor.");
      values.push_back({name, item.value().toTensor()});
    }
    if (saves_pieces()) {
      // Pieces (from a sharded checkpoint) or whole tensors (from a full one), cut here.
      std::map<std::string, torch::Tensor> pieces;
      const auto params = module.named_parameters();
      for (auto& [name, value] : values) {
        if (const auto* p = params.find(name)) {
          const auto info = fsdp->piece_info(*p);
          if (info.sharded && value.sizes().vec() == info.shape) value = value.reshape({-1}).narrow(0, info.begin, info.numel);
        }
        pieces[name] = value;
      }
      fsdp->load_local_pieces(pieces, strict);
      return;
    }
    fsdp->load_full_state_dict(values, strict);
    return;
  }
  Strategy::load_module_state_dict(module, state, strict);
}

c10::impl::GenericDict FSDPStrategy::optimizer_state_dict(const torch::optim::Optimizer& optimizer) {
  auto dict = checkpoint::optimizer_state_dict(optimizer);
  const auto params = parameters_of(optimizer);
  if (params.empty() || options_.sharding_strategy() == distributed::ShardingStrategy::no_shard || saves_pieces()) {
    return dict;  // whole (NO_SHARD), or this rank's pieces for save_checkpoint
  }
  auto& fsdp = wrapper_of(params.front(), "the optimizer");
  const auto wrapped = fsdp.parameters();
  std::unordered_map<const void*, size_t> index_of;
  for (size_t j = 0; j < wrapped.size(); ++j) index_of[wrapped[j].unsafeGetTensorImpl()] = j;
  auto state = dict.at("state").toGenericDict();
  // The per-element keys, the same on every rank (every rank steps every parameter).
  std::set<std::string> keys;
  for (const auto& entry : state) {
    for (const auto& item : entry.value().toGenericDict()) {
      if (item.value().isTensor() && is_per_element(item.key().toStringRef())) keys.insert(item.key().toStringRef());
    }
  }
  for (const auto& key : keys) {
    std::vector<torch::Tensor> pieces(wrapped.size());  // undefined: no state for this key (gathered as zeros)
    for (const auto& entry : state) {
      const auto values = entry.value().toGenericDict();
      const auto& p = params.at(static_cast<size_t>(entry.key().toInt()));
      if (values.contains(key)) pieces[index_of.at(p.unsafeGetTensorImpl())] = values.at(key).toTensor();
    }
    const auto whole = fsdp.gather_pieces(pieces);
    for (const auto& entry : state) {
      auto values = entry.value().toGenericDict();
      const auto& p = params.at(static_cast<size_t>(entry.key().toInt()));
      if (values.contains(key)) values.insert_or_assign(key, whole[index_of.at(p.unsafeGetTensorImpl())]);
    }
  }
  return dict;
}

void FSDPStrategy::load_optimizer_state_dict(torch::optim::Optimizer& optimizer, const c10::impl::GenericDict& state) {
  const auto params = parameters_of(optimizer);
  if (params.empty()) {
    Strategy::load_optimizer_state_dict(optimizer, state);
    return;
  }
  auto& fsdp = wrapper_of(params.front(), "the optimizer");
  // This rank's pieces of the whole state, in a copy: the caller's dict may be loaded again.
  auto pieces = state.copy();
  auto per_parameter = c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get());
  for (const auto& entry : state.at("state").toGenericDict()) {
    const auto index = static_cast<size_t>(entry.key().toInt());
    LOCKSTEP_CHECK(index < params.size(), UsageError, "the optimizer state names parameter ", index, " of ",
                   params.size(), ".");
    auto values = entry.value().toGenericDict().copy();
    for (const auto& item : entry.value().toGenericDict()) {
      if (!item.value().isTensor() || !is_per_element(item.key().toStringRef())) continue;
      // Whole (a full checkpoint) or this rank's piece (a sharded one): this rank's piece, or the
      // whole where the parameter is not sharded.
      const auto info = fsdp.piece_info(params[index]);
      const auto value = item.value().toTensor();
      if (!info.sharded) {
        values.insert_or_assign(item.key(), value.reshape(info.shape));
      } else if (value.sizes().vec() == info.shape) {
        values.insert_or_assign(item.key(), value.reshape({-1}).narrow(0, info.begin, info.numel).clone());
      } else {
        LOCKSTEP_CHECK(value.numel() == info.numel, UsageError, "the optimizer state '", item.key().toStringRef(),
                       "' of parameter ", index, " has ", value.numel(), " elements, neither the whole ",
                       shape_text(info.shape), " nor this rank's piece of ", info.numel, ".");
      }
    }
    per_parameter.insert(entry.key(), values);
  }
  pieces.insert_or_assign("state", per_parameter);
  Strategy::load_optimizer_state_dict(optimizer, pieces);
}

distributed::FullyShardedDataParallelBase::PieceInfo FSDPStrategy::locate(
    const std::string& key, const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers,
    const std::string& path) const {
  const std::string prefix = "state_dict/";
  // A callback's weights (weights_as_pieces) lie as the module's.
  const auto in_callback = key.rfind("callbacks/", 0) == 0 ? key.find("/" + prefix) : std::string::npos;
  if (key.rfind(prefix, 0) == 0 || in_callback != std::string::npos) {
    const auto name = key.substr(in_callback == std::string::npos ? prefix.size() : in_callback + 1 + prefix.size());
    for (const auto& fsdp : all_) {
      const auto params = fsdp->base_module()->named_parameters();
      const auto buffers = fsdp->base_module()->named_buffers();
      if (const auto* p = params.find(name)) return fsdp->piece_info(*p);
      if (const auto* b = buffers.find(name)) {
        distributed::FullyShardedDataParallelBase::PieceInfo info;
        info.shape = b->sizes().vec();
        info.numel = b->numel();
        info.sharded = false;
        return info;
      }
    }
  }
  // optimizer_states/<i>/state/<k>/<name>: state of parameter k of optimizer i.
  std::vector<std::string> parts;
  for (size_t begin = 0, end = 0; end != std::string::npos; begin = end + 1) {
    end = key.find('/', begin);
    parts.push_back(key.substr(begin, end == std::string::npos ? end : end - begin));
  }
  if (parts.size() == 5 && parts[0] == "optimizer_states" && parts[2] == "state") {
    try {
      const auto i = std::stoul(parts[1]);
      const auto k = std::stoul(parts[3]);
      if (i < optimizers.size()) {
        const auto params = parameters_of(*optimizers[i]);
        if (k < params.size()) return wrapper_of(params[k], "the optimizer").piece_info(params[k]);
      }
    } catch (const std::logic_error&) {
    }
  }
  throw UsageError("checkpoint '" + path + "' holds '" + key + "', which this run's model and optimizers have " +
                   "no tensor for. Resume with the model code and configure_optimizers that saved it.");
}

void FSDPStrategy::save_checkpoint(const checkpoint::Checkpoint& state, const std::string& path,
                                   const checkpoint::CheckpointIO& io,
                                   const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers) {
  if (!saves_pieces()) {
    Strategy::save_checkpoint(state, path, io, optimizers);
    return;
  }
  const int rank = global_rank();
  checkpoint::ShardedCheckpoint shard;
  // The parameters, buffers and per-element optimizer state become pieces (one not sharded is
  // rank 0's, whole); everything else is the common part. With HYBRID_SHARD each group of ranks
  // holds the same pieces: the first group (ranks 0 to its size - 1) writes them.
  const int writers = all_.empty() ? world_size() : all_.front()->shard_group().world_size();
  const auto add = [&](const std::string& key, const torch::Tensor& values) {
    const auto info = locate(key, optimizers, path);
    const auto flat = values.detach().reshape({-1});
    const bool writes = info.sharded ? rank < writers : rank == 0;
    shard.pieces[key] = {info.shape, info.begin, writes ? flat : flat.narrow(0, 0, 0)};
  };
  for (const auto& item : state) {
    const auto& name = item.key().toStringRef();
    if (name == "state_dict") {
      for (const auto& tensor : item.value().toGenericDict()) {
        add("state_dict/" + tensor.key().toStringRef(), tensor.value().toTensor());
      }
    } else if (name == "optimizer_states") {
      const auto saved = item.value().toList();
      c10::impl::GenericList common(saved.elementType());
      for (size_t i = 0; i < saved.size(); ++i) {
        auto optimizer = saved.get(i).toGenericDict().copy();
        const auto per_parameter = optimizer.at("state").toGenericDict();
        auto kept = c10::impl::GenericDict(per_parameter.keyType(), per_parameter.valueType());
        for (const auto& entry : per_parameter) {
          const auto values = entry.value().toGenericDict();
          auto scalars = c10::impl::GenericDict(values.keyType(), values.valueType());
          for (const auto& value : values) {
            const auto& key = value.key().toStringRef();
            if (value.value().isTensor() && is_per_element(key)) {
              add("optimizer_states/" + std::to_string(i) + "/state/" + std::to_string(entry.key().toInt()) + "/" + key,
                  value.value().toTensor());
            } else {
              scalars.insert(value.key(), value.value());
            }
          }
          kept.insert(entry.key(), scalars);
        }
        optimizer.insert_or_assign("state", kept);
        common.push_back(optimizer);
      }
      shard.common.insert(item.key(), common);
    } else if (name == "callbacks") {
      shard.common.insert(item.key(), weights_as_pieces(item.value().toGenericDict(), add));
    } else {
      shard.common.insert(item.key(), item.value());
    }
  }
  write_pieces(shard, path, optimizers);
}

void FSDPStrategy::write_pieces(const checkpoint::ShardedCheckpoint& shard, const std::string& path,
                                const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers) {
  const int rank = global_rank();
  const bool dcp = state_dict_type_ == StateDictType::dcp;
  // Before any file is made, and alike on every rank.
  LOCKSTEP_CHECK(!dcp || optimizers.size() <= 1, UsageError, "--fsdp-state-dict-type dcp saves one optimizer "
                 "(DCP's get_state_dict merges several into one \"optim\"), and this run has ", optimizers.size(),
                 ". Use --fsdp-state-dict-type sharded, which keeps each.");
  for (const auto& item : shard.pieces) {
    const auto& key = item.first;
    LOCKSTEP_CHECK(!dcp || key.rfind("callbacks/", 0) != 0, UsageError, "--fsdp-state-dict-type dcp has no place for ",
                   "the weights the callback ", key.substr(10, key.find("/state_dict/") - 10), " keeps (an average ",
                   "of the model's, laid out as its parameters): DCP's get_state_dict holds the model and one ",
                   "optimizer. Use --fsdp-state-dict-type sharded (each rank's pieces) or full.");
  }
  const auto names = dcp && !optimizers.empty() ? parameter_names(*optimizers.front()) : std::vector<std::string>{};
  const auto tmp = checkpoint::begin_sharded_save(path, rank);
  barrier("sharded checkpoint: begin");
  if (dcp) {
    checkpoint::write_dcp_shard(tmp, rank, world_size(), shard, names);
  } else {
    checkpoint::write_shard(tmp, rank, world_size(), shard);
  }
  barrier("sharded checkpoint: rank files written");
  if (rank == 0 && dcp) checkpoint::commit_dcp_save(tmp, path, world_size());
  if (rank == 0 && !dcp) checkpoint::commit_sharded_save(tmp, path, world_size());
}

void FSDPStrategy::check_dcp_parameters(const std::string& path, const torch::optim::Optimizer& optimizer) const {
  const auto saved = checkpoint::read_dcp_parameter_names(path);
  if (saved.empty()) return;  // weights alone
  const auto mine = parameter_names(optimizer);
  for (size_t k = 0; k < std::max(saved.size(), mine.size()); ++k) {
    const std::string there = k < saved.size() ? saved[k] : "none", here = k < mine.size() ? mine[k] : "none";
    LOCKSTEP_CHECK(there == here, UsageError, "DCP checkpoint '", path, "': its optimizer's parameter ", k, " is '",
                   there, "' and this run's is '", here, "' (", saved.size(), " parameters there, ", mine.size(),
                   " here). Resume with the model and configure_optimizers that saved it, the parameters in the same "
                   "order.");
  }
}

std::vector<std::string> FSDPStrategy::parameter_names(const torch::optim::Optimizer& optimizer) const {
  std::unordered_map<const c10::TensorImpl*, std::string> name_of;
  for (const auto& fsdp : all_) {
    for (const auto& item : fsdp->base_module()->named_parameters()) {
      name_of.emplace(item.value().unsafeGetTensorImpl(), item.key());
    }
  }
  std::vector<std::string> names;
  for (const auto& p : parameters_of(optimizer)) {
    const auto it = name_of.find(p.unsafeGetTensorImpl());
    LOCKSTEP_CHECK(it != name_of.end(), UsageError, "a DCP checkpoint names optimizer state by parameter, and the "
                   "optimizer holds a parameter of no module set up with --strategy ", name(),
                   ". Give the optimizer the module's parameters.");
    names.push_back(it->second);
  }
  return names;
}

checkpoint::Checkpoint FSDPStrategy::load_checkpoint(
    const std::string& path, const checkpoint::CheckpointIO& io,
    const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers) {
  const bool dcp = checkpoint::is_dcp_checkpoint(path);
  if (!saves_pieces() || (!dcp && !checkpoint::is_sharded_checkpoint(path))) {
    return Strategy::load_checkpoint(path, io, optimizers);  // the hooks cut whole tensors
  }
  // Only this rank's pieces, in this world size's layout: resharding when the saver's differs.
  std::map<std::string, checkpoint::PieceRange> wanted;
  if (dcp && !optimizers.empty()) check_dcp_parameters(path, *optimizers.front());
  const auto saved = dcp ? checkpoint::read_dcp_tensors(path) : checkpoint::read_sharded_metadata(path).tensors;
  for (const auto& item : saved) {
    const auto info = locate(item.first, optimizers, path);
    LOCKSTEP_CHECK(item.second.shape == info.shape, UsageError, "checkpoint '", path, "': '", item.first, "' is ",
                   shape_text(item.second.shape), " there and ", shape_text(info.shape),
                   " in this run. Resume with the model that saved it.");
    wanted[item.first] = {info.begin, info.numel};
  }
  auto mine = dcp ? checkpoint::load_dcp_pieces(path, wanted, live_pieces(optimizers))
                  : checkpoint::load_sharded_pieces(path, wanted);
  std::map<std::string, torch::Tensor> tensors;
  for (auto& item : mine.pieces) tensors[item.first] = item.second.values;
  return checkpoint::to_full_checkpoint(mine.common, tensors);
}

std::map<std::string, torch::Tensor> FSDPStrategy::live_pieces(
    const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers) {
  std::map<std::string, torch::Tensor> live;
  const auto add = [&](const std::string& key, const torch::Tensor& tensor) {
    if (tensor.is_contiguous()) live[key] = tensor.reshape({-1});  // a view: reading into it fills the tensor
  };
  for (const auto& fsdp : all_) {
    for (const auto& item : module_state_dict(*fsdp->base_module())) add("state_dict/" + item.key(), item.value());
  }
  for (size_t i = 0; i < optimizers.size(); ++i) {
    for (const auto& entry : checkpoint::optimizer_state_dict(*optimizers[i]).at("state").toGenericDict()) {
      for (const auto& value : entry.value().toGenericDict()) {
        const auto& name = value.key().toStringRef();
        if (!value.value().isTensor() || !is_per_element(name)) continue;
        add("optimizer_states/" + std::to_string(i) + "/state/" + std::to_string(entry.key().toInt()) + "/" + name,
            value.value().toTensor());
      }
    }
  }
  return live;
}

}  // namespace strategies
}  // namespace lockstep
