#include <lockstep/fabric/fabric.h>

#include <exception>

#include <torch/nn/utils/clip_grad.h>
#include <torch/torch.h>

#include <lockstep/accelerators/device_parser.h>
#include <lockstep/checkpoint/checkpoint_io.h>
#include <lockstep/checkpoint/optimizer_state.h>
#include <lockstep/checkpoint/state_dict.h>
#include <lockstep/core/blas.h>
#include <lockstep/core/error.h>
#include <lockstep/core/seed.h>
#include <lockstep/environments/cluster_environment.h>

namespace lockstep {
namespace {

// The connector reads TrainerOptions; Fabric has the fields that decide where processes run.
TrainerOptions connector_options(const FabricOptions& o) {
  return TrainerOptions()
      .accelerator(o.accelerator())
      .devices(o.devices())
      .strategy(o.strategy())
      .num_nodes(o.num_nodes())
      .precision(o.precision())
      .process_group_backend(o.process_group_backend())
      .timeout(o.timeout());
}

}  // namespace

NoBackwardSync::NoBackwardSync(strategies::Strategy& strategy, bool enabled) : strategy_(strategy), enabled_(enabled) {
  if (enabled_) strategy_.set_gradient_sync(false);
}

NoBackwardSync::~NoBackwardSync() {
  if (enabled_) strategy_.set_gradient_sync(true);
}

Fabric::Fabric(FabricOptions options) : options_(std::move(options)) {}

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

void Fabric::add_logger(std::shared_ptr<loggers::Logger> logger) {
  LOCKSTEP_CHECK(logger, UsageError, "Fabric::add_logger: the logger is null; pass a logger object.");
  loggers_.push_back(std::move(logger));
}

void Fabric::launch() {
  LOCKSTEP_CHECK(!plan_, UsageError, "Fabric::launch() was called twice; call it once, before setup.");
  core::warn_if_reference_blas();
  plan_ = lockstep::launch(resolve_plan(connector_options(options_), environments::Environ::from_process(),
                                        user_strategy_, accelerators::cuda_device_count()));
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

void Fabric::prepare_module(const std::shared_ptr<torch::nn::Module>& module) {
  const auto& plan = launched("setup");
  LOCKSTEP_CHECK(module, UsageError, "Fabric::setup: the module is null; pass a std::shared_ptr or holder of your module.");
  LOCKSTEP_CHECK(!module_set_up_, UsageError, "Fabric::setup was called a second time: a Fabric wraps one module. "
                 "Put the parts in one module (its children), and for parts trained in alternation (a GAN) use "
                 "--strategy ddp_separate.");
  plan.strategy->module_to_device(*module);
  plan.precision.convert_module(*module);
  plan.strategy->setup_module(module);
  module_set_up_ = true;
}

void Fabric::check_module_is_ours(const strategies::Strategy& strategy) const {
  LOCKSTEP_CHECK(&strategy == &this->strategy(), UsageError,
                 "the module was set up by another Fabric; pass the one this Fabric's setup returned.");
}

FabricOptimizer Fabric::setup_optimizer(std::shared_ptr<torch::optim::Optimizer> optimizer) {
  launched("setup");
  LOCKSTEP_CHECK(optimizer, UsageError, "Fabric::setup: the optimizer is null; pass the one made on the module's "
                 "parameters, e.g. std::make_shared<torch::optim::SGD>(net->parameters(), 0.1).");
  return FabricOptimizer(std::move(optimizer), scaler_.get());
}

FabricDataLoader Fabric::setup_dataloaders(std::shared_ptr<DataLoader> loader) {
  const auto& plan = launched("setup_dataloaders");
  LOCKSTEP_CHECK(loader, UsageError, "Fabric::setup_dataloaders: the loader is null; pass a std::shared_ptr<DataLoader>.");
  strategies::add_distributed_sampler(*plan.strategy, *loader, loader->options().shuffle());
  return FabricDataLoader(std::move(loader), plan.strategy->root_device(), plan.precision);
}

void Fabric::backward(const torch::Tensor& loss) {
  const auto& plan = launched("backward");
  LOCKSTEP_CHECK(module_set_up_, UsageError, "Fabric::backward before setup: wrap the module with fabric.setup(...) "
                 "first, so that the strategy can reduce its gradients.");
  plan.strategy->manual_backward(scaler_ ? scaler_->scale(loss) : loss);
}

torch::Tensor Fabric::clip_gradients(FabricOptimizer& optimizer, double max_norm, double norm_type) {
  LOCKSTEP_CHECK(max_norm > 0, UsageError, "Fabric::clip_gradients: max_norm ", max_norm, " must be above 0.");
  optimizer.unscale();
  const auto params = optimizer.parameters();
  return torch::tensor(torch::nn::utils::clip_grad_norm_(params, max_norm, norm_type));
}

void Fabric::clip_gradients_value(FabricOptimizer& optimizer, double clip_val) {
  LOCKSTEP_CHECK(clip_val > 0, UsageError, "Fabric::clip_gradients_value: clip_val ", clip_val, " must be above 0.");
  optimizer.unscale();
  torch::nn::utils::clip_grad_value_(optimizer.parameters(), clip_val);
}

Precision::StepScope Fabric::autocast() const { return Precision::StepScope(launched("autocast").precision); }

torch::Tensor Fabric::all_reduce(const torch::Tensor& tensor, distributed::ReduceOp op) {
  return strategy().all_reduce(tensor.clone(), op);
}

double Fabric::all_reduce(double value, distributed::ReduceOp op) {
  return strategy().all_reduce(torch::tensor({value}, torch::kFloat64), op).item<double>();
}

torch::Tensor Fabric::all_gather(const torch::Tensor& tensor) {
  const auto parts = strategy().all_gather(tensor);
  for (size_t r = 0; r < parts.size(); ++r) {
    LOCKSTEP_CHECK(parts[r].sizes() == tensor.sizes(), UsageError, "Fabric::all_gather: rank ", r, " gave shape ",
                   parts[r].sizes(), " and rank ", global_rank(), " ", tensor.sizes(),
                   "; stacking needs equal shapes. Pad to one shape, or use strategy().all_gather for a list.");
  }
  return torch::stack(parts);
}

torch::Tensor Fabric::broadcast(const torch::Tensor& tensor, int src) {
  return strategy().broadcast(c10::IValue(tensor), src).toTensor().to(tensor.device());
}

c10::IValue Fabric::broadcast(const c10::IValue& value, int src) { return strategy().broadcast(value, src); }

void Fabric::barrier(const std::string& name) { strategy().barrier(name); }

void Fabric::save(const std::string& path, const FabricState& state) {
  if (strategy().is_global_zero()) {
    auto ckpt = checkpoint::make_checkpoint();
    for (const auto& [key, entry] : state) {
      if (entry.module()) {
        ckpt.insert(key, checkpoint::state_dict(*entry.module()));
      } else if (entry.optimizer()) {
        ckpt.insert(key, checkpoint::optimizer_state_dict(*entry.optimizer()));
      } else {
        ckpt.insert(key, entry.value());
      }
    }
    checkpoint::CheckpointIO().save(ckpt, path);
  }
  strategy().barrier("fabric_save");
}

c10::impl::GenericDict Fabric::load(const std::string& path, FabricState& state) {
  launched("load");
  auto ckpt = checkpoint::CheckpointIO().load(path);
  std::vector<std::string> keys;
  for (const auto& entry : state) keys.push_back(entry.first);
  checkpoint::require_keys(ckpt, keys, path);
  for (auto& [key, entry] : state) {
    const auto value = ckpt.at(key);
    if (entry.module()) {
      LOCKSTEP_CHECK(value.isGenericDict(), UsageError, path, ": '", key, "' holds a ", value.tagKind(),
                     ", not a module's state_dict; load it into a value entry instead.");
      checkpoint::load_state_dict(*entry.module(), value.toGenericDict());
    } else if (entry.optimizer()) {
      LOCKSTEP_CHECK(value.isGenericDict(), UsageError, path, ": '", key, "' holds a ", value.tagKind(),
                     ", not an optimizer's state; load it into a value entry instead.");
      checkpoint::load_optimizer_state_dict(*entry.optimizer(), value.toGenericDict());
    } else {
      entry.set_value(value);
    }
    ckpt.erase(key);
  }
  return ckpt;
}

void Fabric::seed_everything(uint64_t seed) { lockstep::seed_everything(seed); }

void Fabric::log(const std::string& name, double value, int64_t step) { log_dict({{name, value}}, step); }

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
  to_device(batch, device_);
  precision_->convert_batch(batch);
  return batch;
}

}  // namespace lockstep
