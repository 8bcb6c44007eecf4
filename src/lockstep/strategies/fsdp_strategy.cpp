#include <lockstep/strategies/fsdp_strategy.h>

#include <set>
#include <unordered_map>

#include <torch/optim/lbfgs.h>

#include <lockstep/checkpoint/optimizer_state.h>
#include <lockstep/checkpoint/state_dict.h>
#include <lockstep/core/error.h>
#include <lockstep/core/training_module.h>
#include <lockstep/strategies/registry.h>

namespace lockstep {
namespace strategies {
namespace {

const bool fsdp_registered = register_strategy(
    "fsdp", [] { return std::make_shared<FSDPStrategy>(); },
    "sharded data parallel: parameters, gradients and optimizer state split over the ranks (--fsdp-sharding)");

// Fabric's view of one FullyShardedDataParallel.
class FSDPModule : public WrappedModule {
 public:
  explicit FSDPModule(std::shared_ptr<distributed::FullyShardedDataParallelBase> fsdp) : fsdp_(std::move(fsdp)) {}
  void before_forward() override { fsdp_->prepare_forward(); }

 private:
  std::shared_ptr<distributed::FullyShardedDataParallelBase> fsdp_;
};

// Optimizer state that has one value per element of its parameter (not "step").
bool is_per_element(const std::string& key) { return key != "step"; }

std::vector<torch::Tensor> parameters_of(const torch::optim::Optimizer& optimizer) {
  std::vector<torch::Tensor> params;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) params.push_back(p);
  }
  return params;
}

}  // namespace

FSDPStrategy::FSDPStrategy(distributed::ShardingOptions options)
    : DDPStrategy(distributed::DDPOptions(), "popen", "fsdp"), options_(std::move(options)) {}

std::shared_ptr<WrappedModule> FSDPStrategy::setup_module(const std::shared_ptr<torch::nn::Module>& module) {
  LOCKSTEP_CHECK(!context_.sync_batchnorm, UsageError,
                 "--sync-batchnorm true is not available with --strategy fsdp yet; use --strategy ddp for it.");
  std::vector<int> device_ids;
  if (context_.accelerator == accelerators::Accelerator::cuda) device_ids.push_back(root_device().index());
  check_on_device(*module, device_ids);
  fsdp_ = std::make_shared<distributed::FullyShardedDataParallelBase>(module, process_group(), options_);
  all_.push_back(fsdp_);
  return std::make_shared<FSDPModule>(fsdp_);
}

void FSDPStrategy::teardown() {
  fsdp_.reset();
  all_.clear();
  DDPStrategy::teardown();
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
  for (const auto& p : parameters_of(optimizer)) {
    LOCKSTEP_CHECK(optimizer.state().count(c10::guts::to_string(p.unsafeGetTensorImpl())) == 0, UsageError,
                   "--strategy fsdp: the optimizer already has state for its parameters (it stepped, or loaded a "
                   "state), shaped for whole parameters; each rank now holds a shard. Set up the module before "
                   "the optimizer steps, and load checkpoints through the Trainer or Fabric.");
  }
}

c10::Dict<std::string, torch::Tensor> FSDPStrategy::module_state_dict(const torch::nn::Module& module) {
  for (const auto& fsdp : all_) {
    if (fsdp->base_module().get() != &module) continue;
    std::unordered_map<std::string, torch::Tensor> whole;
    for (auto& item : fsdp->full_state_dict()) whole.emplace(item.first, item.second);
    auto state = checkpoint::state_dict(module);  // Python's order of names
    for (const auto& item : state) state.insert_or_assign(item.key(), whole.at(item.key()));
    return state;
  }
  return DDPStrategy::module_state_dict(module);
}

void FSDPStrategy::load_module_state_dict(torch::nn::Module& module, const c10::impl::GenericDict& state,
                                          bool strict) {
  for (const auto& fsdp : all_) {
    if (fsdp->base_module().get() != &module) continue;
    std::vector<std::pair<std::string, torch::Tensor>> values;
    std::set<std::string> known;
    for (const auto& item : checkpoint::state_dict(module)) known.insert(item.key());
    for (const auto& item : state) {
      const auto name = item.key().toStringRef();
      if (!known.count(name)) {
        LOCKSTEP_CHECK(!strict, UsageError, "the state has '", name, "', which the module does not.");
        continue;
      }
      LOCKSTEP_CHECK(item.value().isTensor(), UsageError, "the state's '", name, "' is not a tensor.");
      values.push_back({name, item.value().toTensor()});
    }
    fsdp->load_full_state_dict(values, strict);
    return;
  }
  DDPStrategy::load_module_state_dict(module, state, strict);
}

c10::impl::GenericDict FSDPStrategy::optimizer_state_dict(const torch::optim::Optimizer& optimizer) {
  auto dict = checkpoint::optimizer_state_dict(optimizer);
  const auto params = parameters_of(optimizer);
  if (params.empty() || options_.sharding_strategy() == distributed::ShardingStrategy::no_shard) return dict;
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
    std::vector<torch::Tensor> pieces;
    for (const auto& p : wrapped) pieces.push_back(torch::zeros_like(p));
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
  if (params.empty() || options_.sharding_strategy() == distributed::ShardingStrategy::no_shard) {
    DDPStrategy::load_optimizer_state_dict(optimizer, state);
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
      if (item.value().isTensor() && is_per_element(item.key().toStringRef())) {
        values.insert_or_assign(item.key(), fsdp.piece_of(params[index], item.value().toTensor()));
      }
    }
    per_parameter.insert(entry.key(), values);
  }
  pieces.insert_or_assign("state", per_parameter);
  DDPStrategy::load_optimizer_state_dict(optimizer, pieces);
}

}  // namespace strategies
}  // namespace lockstep
