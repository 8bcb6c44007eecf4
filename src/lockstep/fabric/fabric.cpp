#include <lockstep/fabric/fabric.h>

#include <cmath>
#include <exception>

#include <torch/autograd.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/torch.h>

#include <lockstep/accelerators/device_parser.h>
#include <lockstep/checkpoint/checkpoint_io.h>
#include <lockstep/checkpoint/optimizer_state.h>
#include <lockstep/checkpoint/safetensors.h>
#include <lockstep/checkpoint/state_dict.h>
#include <lockstep/core/blas.h>
#include <lockstep/core/error.h>
#include <lockstep/core/heap.h>
#include <lockstep/core/seed.h>
#include <lockstep/environments/cluster_environment.h>
#include <lockstep/plan/trainer_variables.h>

namespace lockstep {
NoBackwardSync::NoBackwardSync(strategies::WrappedModule& module, bool enabled)
    : module_(module), enabled_(enabled), previous_(module.gradient_sync()) {
  if (enabled_) module_.set_gradient_sync(false);
}

NoBackwardSync::~NoBackwardSync() {
  if (enabled_) module_.set_gradient_sync(previous_);
}

Fabric::Fabric(FabricOptions options) : options_(std::move(options)) {
  apply_trainer_variables(options_, environments::Environ::from_process());
}

Fabric::~Fabric() {
  if (!plan_ || !plan_->strategy->is_global_zero()) return;
  const char* status = std::uncaught_exceptions() > 0 ? "failed" : "success";
  for (auto& logger : loggers_) logger->finalize(status);
}

void Fabric::set_strategy(std::shared_ptr<strategies::Strategy> strategy) {
  LOCKSTEP_CHECK(!plan_, UsageError, "Fabric::set_strategy after launch(): the job already runs with strategy ",
                 plan_ ? plan_->strategy->name() : "", ". Call set_strategy before launch().");
  LOCKSTEP_CHECK(strategy, UsageError, "Fabric::set_strategy: the strategy is null; pass an object, or leave the default.");
  user_strategy_ = std::move(strategy);
}

void Fabric::set_cluster_environment(std::shared_ptr<environments::ClusterEnvironment> environment) {
  LOCKSTEP_CHECK(!plan_, UsageError, "Fabric::set_cluster_environment after launch(): the job already runs in its "
                 "environment. Call it before launch().");
  LOCKSTEP_CHECK(environment, UsageError, "Fabric::set_cluster_environment: the environment is null; pass an object, "
                 "or leave the detected one.");
  user_environment_ = std::move(environment);
}

void Fabric::add_logger(std::shared_ptr<loggers::Logger> logger) {
  LOCKSTEP_CHECK(logger, UsageError, "Fabric::add_logger: the logger is null; pass a logger object.");
  loggers_.push_back(std::move(logger));
}

void Fabric::set_checkpoint_io(std::shared_ptr<checkpoint::CheckpointIO> io) {
  LOCKSTEP_CHECK(io, UsageError, "Fabric::set_checkpoint_io: the CheckpointIO is null; pass an object, or leave the default.");
  checkpoint_io_ = std::move(io);
}

void Fabric::launch() {
  LOCKSTEP_CHECK(!plan_, UsageError, "Fabric::launch() was called twice; call it once, before setup.");
  core::warn_if_reference_blas();
  auto plan = resolve_plan(options_, environments::Environ::from_process(), user_strategy_,
                           accelerators::cuda_device_count(), accelerators::probe_cuda_device, user_environment_);
  // Fabric::save gathers whole tensors; a strategy that saves each rank's pieces would write
  // only rank 0's.
  LOCKSTEP_CHECK(!plan.strategy->saves_pieces(), UsageError, "Fabric::save writes whole tensors gathered from "
                 "every rank, and strategy ", plan.strategy->name(), " saves each rank's pieces (FSDPStrategy with "
                 "StateDictType::sharded or dcp, which are for the Trainer's checkpoints). Give it StateDictType::full.");
  plan_ = lockstep::launch(std::move(plan));
  core::tune_heap_for_training();  // every process of the job; a sharded strategy narrows it in setup
  if (plan_->precision.scales_loss()) scaler_ = std::make_unique<GradScaler>();
}

const ExecutionPlan& Fabric::launched(const char* call) const {
  LOCKSTEP_CHECK(plan_, UsageError, "Fabric::", call, " before launch(): the processes and the device are known "
                 "only once the job runs. Call fabric.launch() first.");
  return *plan_;
}

strategies::Strategy& Fabric::strategy() const { return *launched("strategy()").strategy; }
int Fabric::global_rank() const { return strategy().global_rank(); }
int Fabric::local_rank() const { return strategy().local_rank(); }
int Fabric::node_rank() const { return strategy().node_rank(); }
int Fabric::world_size() const { return strategy().world_size(); }
torch::Device Fabric::device() const { return strategy().root_device(); }
accelerators::Accelerator Fabric::accelerator() const { return launched("accelerator()").context.accelerator; }

std::shared_ptr<strategies::WrappedModule> Fabric::prepare_module(const std::shared_ptr<torch::nn::Module>& module) {
  const auto& plan = launched("setup");
  LOCKSTEP_CHECK(module, UsageError, "Fabric::setup: the module is null; pass a std::shared_ptr or holder of your module.");
  plan.strategy->module_to_device(*module);
  plan.precision.convert_module(*module);
  auto wrapped = plan.strategy->setup_module(module);
  ++modules_set_up_;
  return wrapped;
}

void Fabric::check_module_is_ours(const strategies::Strategy& strategy) const {
  LOCKSTEP_CHECK(&strategy == &this->strategy(), UsageError,
                 "the module was set up by another Fabric; pass the one this Fabric's setup returned.");
}

FabricOptimizer Fabric::setup_optimizers(std::shared_ptr<torch::optim::Optimizer> optimizer) {
  launched("setup");
  LOCKSTEP_CHECK(optimizer, UsageError, "Fabric::setup: the optimizer is null; pass the one made on the module's "
                 "parameters, e.g. std::make_shared<torch::optim::SGD>(net->parameters(), 0.1).");
  strategy().check_optimizer(*optimizer);
  FabricOptimizer wrapped(std::move(optimizer), scaler_.get());
  if (scaler_) scaler_->watch(wrapped.parameters());
  return wrapped;
}

FabricDataLoader Fabric::setup_dataloaders(std::shared_ptr<DataLoader> loader, bool use_distributed_sampler,
                                           bool move_to_device) {
  const auto& plan = launched("setup_dataloaders");
  LOCKSTEP_CHECK(loader, UsageError, "Fabric::setup_dataloaders: the loader is null; pass a std::shared_ptr<DataLoader>.");
  if (use_distributed_sampler) strategies::add_distributed_sampler(*plan.strategy, *loader, loader->options().shuffle());
  return FabricDataLoader(std::move(loader), plan.strategy->root_device(), plan.precision, move_to_device);
}

void Fabric::backward(const torch::Tensor& loss) {
  const auto& plan = launched("backward");
  LOCKSTEP_CHECK(modules_set_up_ > 0, UsageError, "Fabric::backward before setup: wrap the module with "
                 "fabric.setup(...) first, so that the strategy can reduce its gradients.");
  if (!scaler_) {
    plan.strategy->backward(loss);
    return;
  }
  scaler_->backward(loss, [&](const torch::Tensor& scaled) { plan.strategy->backward(scaled); });
}

torch::Tensor Fabric::clip_gradients(FabricOptimizer& optimizer, double max_norm, double norm_type,
                                     bool error_if_nonfinite) {
  LOCKSTEP_CHECK(max_norm > 0, UsageError, "Fabric::clip_gradients: max_norm ", max_norm, " must be above 0.");
  optimizer.unscale();
  const auto params = optimizer.parameters();
  if (error_if_nonfinite) {
    const double total = strategy().gradient_norm(params, norm_type);
    if (!std::isfinite(total)) {
      throw Error(ErrorKind::training,
                  detail::concat("Fabric::clip_gradients: the total norm of the gradients (order ", norm_type, ") is ",
                                 total, " on rank ", global_rank(), ", so they cannot be clipped; they are left as ",
                                 "they were. Find where the loss became inf or NaN, or pass error_if_nonfinite = false ",
                                 "to clip anyway."));
    }
  }
  return torch::tensor(strategy().clip_grad_norm(params, max_norm, norm_type));
}

void Fabric::clip_gradients_value(FabricOptimizer& optimizer, double clip_val) {
  LOCKSTEP_CHECK(clip_val > 0, UsageError, "Fabric::clip_gradients_value: clip_val ", clip_val, " must be above 0.");
  optimizer.unscale();
  torch::nn::utils::clip_grad_value_(optimizer.parameters(), clip_val);
}

Precision::StepScope Fabric::autocast() const { return Precision::StepScope(launched("autocast").precision); }

distributed::ProcessGroup* Fabric::group_or_job(distributed::ProcessGroup* group) const {
  if (group) return group;
  return strategy().group().get();
}

torch::Tensor Fabric::all_reduce(const torch::Tensor& tensor, distributed::ReduceOp op, distributed::ProcessGroup* group) {
  auto* g = group_or_job(group);
  return g ? distributed::all_reduce(*g, tensor.clone(), op) : tensor.clone();
}

double Fabric::all_reduce(double value, distributed::ReduceOp op, distributed::ProcessGroup* group) {
  return all_reduce(torch::tensor({value}, torch::kFloat64), op, group).item<double>();
}

std::vector<torch::Tensor> Fabric::all_reduce(const std::vector<torch::Tensor>& tensors, distributed::ReduceOp op,
                                              distributed::ProcessGroup* group) {
  std::vector<torch::Tensor> out;
  for (const auto& t : tensors) out.push_back(all_reduce(t, op, group));
  return out;
}

std::map<std::string, torch::Tensor> Fabric::all_reduce(const std::map<std::string, torch::Tensor>& tensors,
                                                        distributed::ReduceOp op, distributed::ProcessGroup* group) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& [key, t] : tensors) out[key] = all_reduce(t, op, group);
  return out;
}

namespace {

torch::Tensor gather_stacked(distributed::ProcessGroup& group, const torch::Tensor& tensor) {
  const auto parts = distributed::all_gather(group, tensor);
  for (size_t r = 0; r < parts.size(); ++r) {
    LOCKSTEP_CHECK(parts[r].sizes() == tensor.sizes(), UsageError, "Fabric::all_gather: rank ", r, " gave shape ",
                   parts[r].sizes(), " and rank ", group.rank(), " ", tensor.sizes(),
                   "; stacking needs equal shapes. Pad to one shape, or use strategy().all_gather for a list.");
  }
  return torch::stack(parts);
}

// all_gather whose backward sends each rank the sum over the ranks of its slice's gradient.
struct AllGatherWithGrads : torch::autograd::Function<AllGatherWithGrads> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& tensor, int64_t group) {
    ctx->saved_data["group"] = group;
    return gather_stacked(*reinterpret_cast<distributed::ProcessGroup*>(group), tensor.detach());
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto& group = *reinterpret_cast<distributed::ProcessGroup*>(ctx->saved_data["group"].toInt());
    auto summed = distributed::all_reduce(group, grads[0].contiguous().clone(), distributed::ReduceOp::sum,
                                          distributed::CollectiveOptions().tag("all_gather's backward (sync_grads)"));
    return {summed[group.rank()], torch::Tensor()};
  }
};

}  // namespace

torch::Tensor Fabric::all_gather(const torch::Tensor& tensor, distributed::ProcessGroup* group, bool sync_grads) {
  auto* g = group_or_job(group);
  if (!g) return tensor.unsqueeze(0);
  if (!sync_grads) return gather_stacked(*g, tensor.detach());
  return AllGatherWithGrads::apply(tensor, reinterpret_cast<int64_t>(g));
}

std::vector<torch::Tensor> Fabric::all_gather(const std::vector<torch::Tensor>& tensors,
                                              distributed::ProcessGroup* group, bool sync_grads) {
  std::vector<torch::Tensor> out;
  for (const auto& t : tensors) out.push_back(all_gather(t, group, sync_grads));
  return out;
}

std::map<std::string, torch::Tensor> Fabric::all_gather(const std::map<std::string, torch::Tensor>& tensors,
                                                        distributed::ProcessGroup* group, bool sync_grads) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& [key, t] : tensors) out[key] = all_gather(t, group, sync_grads);
  return out;
}

torch::Tensor Fabric::broadcast(const torch::Tensor& tensor, int src, distributed::ProcessGroup* group) {
  return broadcast(c10::IValue(tensor), src, group).toTensor().to(tensor.device());
}

std::vector<torch::Tensor> Fabric::broadcast(const std::vector<torch::Tensor>& tensors, int src,
                                             distributed::ProcessGroup* group) {
  std::vector<torch::Tensor> out;
  for (const auto& t : tensors) out.push_back(broadcast(t, src, group));
  return out;
}

std::map<std::string, torch::Tensor> Fabric::broadcast(const std::map<std::string, torch::Tensor>& tensors, int src,
                                                       distributed::ProcessGroup* group) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& [key, t] : tensors) out[key] = broadcast(t, src, group);
  return out;
}

c10::IValue Fabric::broadcast(const c10::IValue& value, int src, distributed::ProcessGroup* group) {
  auto* g = group_or_job(group);
  return g ? distributed::broadcast(*g, value, src) : value;
}

std::shared_ptr<distributed::ProcessGroup> Fabric::new_group(const std::vector<int>& ranks) {
  auto job = strategy().group();
  LOCKSTEP_CHECK(job, UsageError, "Fabric::new_group: this job runs one process (strategy ", strategy().name(),
                 "), so there are no ranks to group; the collectives take no group here.");
  return job->new_subgroup(ranks);
}

void Fabric::barrier(const std::string& name) { strategy().barrier(name); }

namespace {

// A .safetensors file holds one module's weights; Fabric refuses to drop (or leave unloaded) the
// rest of a state. `call` is "Fabric::save" or "Fabric::load".
void check_weights_only(const std::string& call, const std::string& path, const FabricState& state) {
  const bool saving = call == "Fabric::save";
  std::string modules, others;
  int module_count = 0;
  for (const auto& [key, entry] : state) {
    module_count += entry.module() ? 1 : 0;
    if (entry.module()) modules += (modules.empty() ? "'" : ", '") + key + "'";
    if (!entry.module()) others += (others.empty() ? "'" : ", '") + key + (entry.optimizer() ? "' (an optimizer)" : "' (a value)");
  }
  LOCKSTEP_CHECK(others.empty(), UsageError, call, "(\"", path, "\"): a .safetensors file holds one module's ",
                 "weights and nothing else, and the state also holds ", others, ". ",
                 saving ? "Save the weights alone there (fabric.save(path, {{\"model\", model}})), and the whole state "
                          "to a .ckpt file to resume from."
                        : "Load the weights alone from it (fabric.load(path, {{\"model\", model}})), and the rest from "
                          "the .ckpt file saved with them.");
  LOCKSTEP_CHECK(module_count == 1, UsageError, call, "(\"", path,
                 "\"): a .safetensors file holds one module's weights, and the state holds ",
                 modules.empty() ? std::string("none") : modules, ". ",
                 saving ? "Save each module to a file of its own." : "Load each module from a file of its own.");
}

}  // namespace

void Fabric::save(const std::string& path, const FabricState& state, const SaveFilter& filter) {
  const bool safetensors = checkpoint::is_safetensors_path(path);
  if (safetensors) check_weights_only("Fabric::save", path, state);
  for (const auto& [key, keep] : filter) {
    auto it = state.find(key);
    LOCKSTEP_CHECK(it != state.end() && it->second.module(), UsageError, "Fabric::save: the filter for '", key,
                   "' needs a module under that key in the state; filters apply to modules' state_dicts.");
  }
  if (safetensors) {  // the one module's weights; an index path: one shard per rank
    const auto& [key, entry] = *state.begin();
    const auto keep = filter.find(key);
    strategy().save_safetensors(*entry.module(), path, keep == filter.end() ? strategies::TensorFilter() : keep->second);
    return;
  }
  // A sharded strategy gathers the state from every rank; rank 0 writes it.
  if (strategy().shards_state() || strategy().is_global_zero()) {
    auto ckpt = checkpoint::make_checkpoint();
    for (const auto& [key, entry] : state) {
      if (entry.module()) {
        auto tensors = strategy().module_state_dict(*entry.module());
        auto keep = filter.find(key);
        c10::Dict<std::string, torch::Tensor> kept;
        for (const auto& item : tensors) {
          if (keep == filter.end() || keep->second(item.key(), item.value())) kept.insert(item.key(), item.value());
        }
        ckpt.insert(key, kept);
      } else if (entry.optimizer()) {
        ckpt.insert(key, strategy().optimizer_state_dict(*entry.optimizer()));
      } else {
        ckpt.insert(key, entry.value());
      }
    }
    if (strategy().is_global_zero()) checkpoint_io_->save(ckpt, path);
  }
  strategy().barrier("fabric_save");
}

namespace {

void restore(strategies::Strategy& strategy, const std::string& path, const std::string& key, const c10::IValue& value,
             StateEntry& entry, bool strict) {
  if (entry.module()) {
    LOCKSTEP_CHECK(value.isGenericDict(), UsageError, path, ": '", key, "' holds a ", value.tagKind(),
                   ", not a module's state_dict; load it into a value entry instead.");
    strategy.load_module_state_dict(*entry.module(), value.toGenericDict(), strict);
  } else if (entry.optimizer()) {
    LOCKSTEP_CHECK(value.isGenericDict(), UsageError, path, ": '", key, "' holds a ", value.tagKind(),
                   ", not an optimizer's state; load it into a value entry instead.");
    strategy.load_optimizer_state_dict(*entry.optimizer(), value.toGenericDict());
  } else {
    entry.set_value(value);
  }
}

}  // namespace

c10::impl::GenericDict Fabric::load(const std::string& path, FabricState& state, bool strict) {
  if (checkpoint::is_safetensors_path(path)) {  // what save() wrote there: the one module's state_dict
    check_weights_only("Fabric::load", path, state);
    load_raw(path, state.begin()->second, strict);
    return checkpoint::make_checkpoint();
  }
  auto ckpt = load(path).copy();  // the entries restored are removed below; the CheckpointIO may keep its dict
  if (strict) {
    std::vector<std::string> keys;
    for (const auto& entry : state) keys.push_back(entry.first);
    checkpoint::require_keys(ckpt, keys, path);
  }
  for (auto& [key, entry] : state) {
    if (!ckpt.contains(key)) continue;  // only without strict
    restore(strategy(), path, key, ckpt.at(key), entry, strict);
    (void)ckpt.erase(key);
  }
  return ckpt;
}

c10::impl::GenericDict Fabric::load(const std::string& path) {
  launched("load");
  return checkpoint_io_->load(path);
}

void Fabric::load_raw(const std::string& path, const StateEntry& target, bool strict, const checkpoint::KeyMap& keys) {
  LOCKSTEP_CHECK(target.module() || target.optimizer(), UsageError, "Fabric::load_raw(\"", path, "\"): the target ",
                 "is a value; load_raw restores a module or an optimizer. Use load(path) for the whole file.");
  StateEntry entry = target;
  const auto file = load(path);
  restore(strategy(), path, "the file", c10::IValue(target.module() ? keys.apply(file) : file), entry, strict);
}

void Fabric::seed_everything(uint64_t seed) { lockstep::seed_everything(seed); }

void Fabric::log(const std::string& name, double value, int64_t step) { log_dict({{name, value}}, step); }

loggers::Logger& Fabric::logger() const {
  LOCKSTEP_CHECK(!loggers_.empty(), UsageError, "Fabric::logger(): no logger was added; call "
                 "fabric.add_logger(std::make_shared<loggers::CSVLogger>(...)) first.");
  return *loggers_.front();
}

void Fabric::add_callback(std::shared_ptr<FabricCallback> callback) {
  LOCKSTEP_CHECK(callback, UsageError, "Fabric::add_callback: the callback is null; pass a callback object.");
  callbacks_.push_back(std::move(callback));
}

void Fabric::call(const std::string& name, const std::vector<c10::IValue>& args) {
  for (const auto& callback : callbacks_) callback->run(name, args);
}

void Fabric::log_dict(const std::map<std::string, double>& metrics, int64_t step) {
  if (!strategy().is_global_zero()) return;
  for (auto& logger : loggers_) logger->log_metrics(metrics, step);
}

bool FabricOptimizer::unscale() {
  if (!finite_) finite_ = scaler_ ? scaler_->unscale(parameters()) : true;
  return *finite_;
}

bool FabricOptimizer::step() {
  const bool finite = unscale();
  finite_.reset();
  if (finite) optimizer_->step();
  if (scaler_) scaler_->update(!finite);
  return finite;
}

std::vector<torch::Tensor> FabricOptimizer::parameters() const {
  std::vector<torch::Tensor> params;
  for (const auto& group : optimizer_->param_groups()) {
    params.insert(params.end(), group.params().begin(), group.params().end());
  }
  return params;
}

Batch FabricDataLoader::batch(int64_t i) {
  Batch batch = loader_->batch(i);
  if (move_to_device_) to_device(batch, device_);
  precision_->convert_batch(batch);
  return batch;
}

}  // namespace lockstep
