#pragma once
/// Fabric: distributed training in your own loop (Lightning Fabric). The Trainer's options,
/// environment detection, launchers, strategies, precision and checkpoint format, without its
/// loops: you keep the loop, Fabric makes it run on one process or many.

#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/core/ivalue.h>
#include <c10/core/DefaultDtype.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/optimizer.h>

#include <lockstep/checkpoint/checkpoint_io.h>
#include <lockstep/checkpoint/key_map.h>
#include <lockstep/data/data_loader.h>
#include <lockstep/data/dataset.h>
#include <lockstep/distributed/collectives.h>
#include <lockstep/fabric/fabric_callback.h>
#include <lockstep/fabric/fabric_module.h>
#include <lockstep/fabric/fabric_options.h>
#include <lockstep/fabric/fabric_state.h>
#include <lockstep/launchers/launcher.h>
#include <lockstep/loggers/logger.h>
#include <lockstep/plan/connector.h>
#include <lockstep/plan/grad_scaler.h>
#include <lockstep/strategies/strategy.h>

namespace lockstep {

/// While alive, backward passes through `module` accumulate gradients on each rank without
/// communicating; the first backward after it reduces the sum (gradient accumulation). Inert when
/// not `enabled`. Restores the sync state it found, so guards nest.
class [[nodiscard]] NoBackwardSync {
 public:
  NoBackwardSync(strategies::WrappedModule& module, bool enabled);
  ~NoBackwardSync();
  NoBackwardSync(const NoBackwardSync&) = delete;
  NoBackwardSync& operator=(const NoBackwardSync&) = delete;

 private:
  strategies::WrappedModule& module_;
  bool enabled_;
  bool previous_;
};

/// What Fabric::save keeps of a module's state_dict, by the state's key: entries for which the
/// function returns true (name, tensor).
using SaveFilter = std::map<std::string, std::function<bool(const std::string&, const torch::Tensor&)>>;

/// FabricOptimizer, for each optimizer given to Fabric::setup.
template <typename Optimizer>
using OptimizerOf = FabricOptimizer;

///   Fabric fabric(FabricOptions().devices("2").strategy("ddp"));
///   fabric.launch();                                   // starts rank 1; both continue here
///   auto sgd = std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.1));
///   auto [model, optimizer] = fabric.setup(net, sgd);
///   auto loader = fabric.setup_dataloaders(train);    // this rank's share, on the device
///   for (int64_t i = 0; i < loader.num_batches(); ++i) {
///     Batch batch = loader.batch(i);
///     auto loss = torch::nn::functional::cross_entropy(model(batch.data), batch.target);
///     optimizer->zero_grad();
///     fabric.backward(loss);                           // gradients averaged over the ranks
///     optimizer->step();
///   }
///   fabric.save("last.ckpt", {{"state_dict", model}, {"optimizer", optimizer}});
///
/// Several modules and optimizers (a GAN, teacher and student) are set up alike, each module in
/// its own DistributedDataParallel under DDP:
///   auto [generator, opt_g] = fabric.setup(g, adam_g);
///   auto [discriminator, opt_d] = fabric.setup(d, adam_d);
///
/// Every rank must make the same calls of setup, backward, save, load and the collectives, in
/// the same order. Bad options are UsageErrors (exit code 2 under cli::guarded_main).
class Fabric {
 public:
  /// Fields of `options` still at their defaults take their LOCKSTEP_TRAINER_* variables
  /// (apply_trainer_variables), unless the options came through cli::add_fabric_flags.
  explicit Fabric(FabricOptions options = {});
  /// Finalizes the loggers on rank 0.
  ~Fabric();
  Fabric(const Fabric&) = delete;
  Fabric& operator=(const Fabric&) = delete;

  /// A Strategy object instead of the strategy name (a DDPStrategy with its own configure_ddp or
  /// DDPOptions); before launch(). The strategy option must then stay auto or be its name.
  void set_strategy(std::shared_ptr<strategies::Strategy> strategy);
  /// Your own ClusterEnvironment instead of the detected one (Lightning's
  /// plugins=[MyClusterEnvironment()]): the job takes its ranks, world size and main address.
  /// Before launch(); its creates_processes_externally() must be true.
  void set_cluster_environment(std::shared_ptr<environments::ClusterEnvironment> environment);
  /// Where log() and log_dict() go (rank 0 writes). Default: none.
  void add_logger(std::shared_ptr<loggers::Logger> logger);
  /// Where save(), load() and load_raw() write and read checkpoints (Lightning Fabric's
  /// `plugins=[checkpoint_io]`): override CheckpointIO to store them elsewhere. Default: CheckpointIO.
  void set_checkpoint_io(std::shared_ptr<checkpoint::CheckpointIO> io);
  checkpoint::CheckpointIO& checkpoint_io() const { return *checkpoint_io_; }

  /// Resolves the options against the environment and starts the job: with --devices N and no
  /// scheduler, re-executes the program for local ranks 1..N-1 (as the Trainer does); under
  /// torchrun, srun, mpirun or `lockstep launch`, joins their job. Returns in every process,
  /// after the process group exists. Call once, before anything else.
  void launch();
  /// launch(), then fn(*this) in every process; returns what fn returns. When fn throws in the
  /// process that started the job, the other processes are ended before the exception leaves.
  template <typename Fn>
  auto launch(Fn&& fn) -> decltype(fn(std::declval<Fabric&>()));

  /// Moves `module` to the device, converts it to the precision (64-true), wraps it by the
  /// strategy (its own DDP, one DDP per child for ddp_separate, or a custom configure_ddp), and
  /// binds the optimizers (made on the module's parameters) to the precision:
  ///   auto [model, optimizer] = fabric.setup(net, sgd);
  ///   auto [model, opt_a, opt_b] = fabric.setup(net, adam, sgd);
  /// Call it once per module; a module without optimizers: setup_module.
  template <typename ModuleType, typename... Optimizers>
  auto setup(std::shared_ptr<ModuleType> module, Optimizers... optimizers)
      -> std::tuple<FabricModule<ModuleType>, OptimizerOf<Optimizers>...>;
  template <typename ModuleType, typename... Optimizers>
  auto setup(const torch::nn::ModuleHolder<ModuleType>& module, Optimizers... optimizers) {
    return setup(module.ptr(), std::move(optimizers)...);
  }
  /// The module part of setup, for a module trained without an optimizer of its own or with
  /// optimizers made afterwards (setup_optimizers).
  template <typename ModuleType>
  FabricModule<ModuleType> setup_module(std::shared_ptr<ModuleType> module);
  template <typename ModuleType>
  FabricModule<ModuleType> setup_module(const torch::nn::ModuleHolder<ModuleType>& module) {
    return setup_module(module.ptr());
  }
  /// The optimizer part: one optimizer gives a FabricOptimizer, several a tuple of them.
  FabricOptimizer setup_optimizers(std::shared_ptr<torch::optim::Optimizer> optimizer);
  template <typename... Optimizers, std::enable_if_t<(sizeof...(Optimizers) > 1), int> = 0>
  std::tuple<OptimizerOf<Optimizers>...> setup_optimizers(Optimizers... optimizers) {
    return {setup_optimizers(std::shared_ptr<torch::optim::Optimizer>(std::move(optimizers)))...};
  }
  /// Puts a DistributedSampler on `loader` under DDP (unless it has a sampler of its own, or
  /// `use_distributed_sampler` is false: the loader's shuffle and seed order the epochs), and
  /// returns it with batches moved to the device (unless `move_to_device` is false).
  FabricDataLoader setup_dataloaders(std::shared_ptr<DataLoader> loader, bool use_distributed_sampler = true,
                                     bool move_to_device = true);
  /// The same for a LibTorch torch::data dataset (anything with get(size_t) and size()), read in
  /// batches as `options` say.
  template <typename TorchDataset,
            std::enable_if_t<!std::is_convertible<TorchDataset, std::shared_ptr<DataLoader>>::value, int> = 0>
  FabricDataLoader setup_dataloaders(TorchDataset dataset, DataLoaderOptions options,
                                     bool use_distributed_sampler = true, bool move_to_device = true) {
    return setup_dataloaders(std::make_shared<DataLoader>(from_torch_dataset(std::move(dataset)), std::move(options)),
                             use_distributed_sampler, move_to_device);
  }
  /// Builds a module with `make` (a function returning a std::shared_ptr or holder) in the
  /// precision's dtype (float64 under 64-true: its parameters are made in it, not converted) and
  /// moves it to this rank's device. LibTorch has no default device, so parameters are made on
  /// the CPU first.
  template <typename Make>
  auto init_module(Make&& make) -> decltype(make());
  /// `value` on this rank's device: a tensor, a Batch, and vectors, maps, pairs and tuples of
  /// them, nested; your own types through a to_device overload (core/batch.h).
  template <typename T>
  T to_device(T value) const {
    lockstep::to_device(value, device());
    return value;
  }

  /// loss.backward() as the precision and strategy need: under 16-mixed the loss is scaled
  /// first. The forwards through the set-up modules armed DDP's reduction, so a plain
  /// loss.backward() averages the gradients as well, except under 16-mixed, where the
  /// optimizer's step refuses gradients that were not scaled.
  void backward(const torch::Tensor& loss);
  /// Clips the gradients of `optimizer`'s parameters to a total `max_norm` (of `norm_type`);
  /// returns the norm before clipping. Under 16-mixed the gradients are unscaled first. With
  /// `error_if_nonfinite` (Lightning's default) a total norm that is inf or NaN is an Error of
  /// kind training and leaves the gradients as they were; otherwise they are clipped anyway.
  torch::Tensor clip_gradients(FabricOptimizer& optimizer, double max_norm, double norm_type = 2.0,
                               bool error_if_nonfinite = true);
  /// Clamps every gradient element of `optimizer`'s parameters to [-clip_val, clip_val].
  void clip_gradients_value(FabricOptimizer& optimizer, double clip_val);
  /// Accumulation without communication while the guard lives (when `enabled`):
  ///   { auto guard = fabric.no_backward_sync(model, i % 4 != 3); fabric.backward(loss); }
  template <typename ModuleType>
  NoBackwardSync no_backward_sync(const FabricModule<ModuleType>& module, bool enabled = true) {
    check_module_is_ours(module.strategy());
    return NoBackwardSync(module.wrapped(), enabled);
  }
  /// The precision's autocast while the scope lives (bf16-mixed, 16-mixed; inert otherwise), for
  /// code outside the module's forward, such as a loss.
  Precision::StepScope autocast() const;

  // Across ranks; every rank of `group` (default: the job) must call, in the same order. With one
  // process they return their input.
  /// `tensor` reduced over the ranks (mean, sum, max, min, product); `tensor` itself is unchanged.
  torch::Tensor all_reduce(const torch::Tensor& tensor, distributed::ReduceOp op = distributed::ReduceOp::mean,
                           distributed::ProcessGroup* group = nullptr);
  double all_reduce(double value, distributed::ReduceOp op = distributed::ReduceOp::mean,
                    distributed::ProcessGroup* group = nullptr);
  /// Each tensor of a collection reduced, in order (a dict of metrics, a list of tensors).
  std::vector<torch::Tensor> all_reduce(const std::vector<torch::Tensor>& tensors,
                                        distributed::ReduceOp op = distributed::ReduceOp::mean,
                                        distributed::ProcessGroup* group = nullptr);
  std::map<std::string, torch::Tensor> all_reduce(const std::map<std::string, torch::Tensor>& tensors,
                                                  distributed::ReduceOp op = distributed::ReduceOp::mean,
                                                  distributed::ProcessGroup* group = nullptr);
  /// Every rank's `tensor` stacked in rank order: shape (group size, ...); equal shapes needed.
  /// With `sync_grads` the result carries gradients back to every rank's `tensor` (each rank's
  /// gradient is the sum over the ranks of the gradient of its slice), as Lightning's does.
  torch::Tensor all_gather(const torch::Tensor& tensor, distributed::ProcessGroup* group = nullptr,
                           bool sync_grads = false);
  std::vector<torch::Tensor> all_gather(const std::vector<torch::Tensor>& tensors,
                                        distributed::ProcessGroup* group = nullptr, bool sync_grads = false);
  std::map<std::string, torch::Tensor> all_gather(const std::map<std::string, torch::Tensor>& tensors,
                                                  distributed::ProcessGroup* group = nullptr, bool sync_grads = false);
  /// Rank `src`'s tensor on every rank, on this rank's device (`src` counts in `group`).
  torch::Tensor broadcast(const torch::Tensor& tensor, int src = 0, distributed::ProcessGroup* group = nullptr);
  std::vector<torch::Tensor> broadcast(const std::vector<torch::Tensor>& tensors, int src = 0,
                                       distributed::ProcessGroup* group = nullptr);
  std::map<std::string, torch::Tensor> broadcast(const std::map<std::string, torch::Tensor>& tensors, int src = 0,
                                                 distributed::ProcessGroup* group = nullptr);
  /// Rank `src`'s value on every rank: a string, a number, a list or dict of them.
  c10::IValue broadcast(const c10::IValue& value, int src = 0, distributed::ProcessGroup* group = nullptr);
  /// Waits until every rank arrived at the barrier `name`.
  void barrier(const std::string& name = "fabric");
  /// A group of some of the job's ranks, for the collectives' `group` (torch.distributed's
  /// new_group): every rank must call it with the same list; null on ranks outside it.
  std::shared_ptr<distributed::ProcessGroup> new_group(const std::vector<int>& ranks);
  /// Runs `fn` on rank 0 first and on the other ranks after it has returned (Lightning's
  /// rank_zero_first), e.g. to download or prepare a file once; `local`: local rank 0 of each
  /// node first. Returns what `fn` returns.
  template <typename Fn>
  auto rank_zero_first(Fn&& fn, bool local = false) -> decltype(fn());

  // This process in the job (known after launch()).
  int global_rank() const;
  int local_rank() const;
  int node_rank() const;
  int world_size() const;
  bool is_global_zero() const { return global_rank() == 0; }
  /// The device this rank computes on.
  torch::Device device() const;
  /// The accelerator the job runs on (cpu or cuda).
  accelerators::Accelerator accelerator() const;
  strategies::Strategy& strategy() const;
  /// Prints the parts and a newline to stdout, on rank 0 only.
  template <typename... Parts>
  void print(const Parts&... parts) const;

  /// Writes `state` to `path` in the Trainer's checkpoint format (Python's torch.load reads it):
  /// modules as their state_dict, optimizers in Python's layout, values as they are. Rank 0
  /// writes, through checkpoint_io(); every rank waits for it. `filter` keeps, for a module's
  /// key, only the state_dict entries it returns true for (e.g. the trainable parameters of a
  /// fine-tuned model). A path ending in ".safetensors" (or ".safetensors.index.json") writes
  /// the module's state_dict as safetensors, for Hugging Face tools and Python's
  /// `safetensors.torch.load_file`: `state` must then hold one module and nothing else (an
  /// optimizer or a value is refused by name: save the whole state to a .ckpt file to resume).
  ///   fabric.save("model.safetensors", {{"model", model}});
  void save(const std::string& path, const FabricState& state, const SaveFilter& filter = {});
  /// Restores every entry of `state` from the checkpoint at `path` (modules and optimizers in
  /// place, values replaced), on every rank. Returns the checkpoint's other entries. A missing
  /// file, or (with `strict`) a key of `state` the checkpoint lacks or a module whose parameter
  /// names differ, is a UsageError naming it; without `strict` those are skipped. A path ending
  /// in ".safetensors" (or ".safetensors.index.json") loads into the one module `state` holds, as
  /// save() wrote it (an optimizer or a value in `state` is refused by name), and returns {}.
  c10::impl::GenericDict load(const std::string& path, FabricState& state, bool strict = true);
  /// The whole checkpoint at `path`, restoring nothing.
  c10::impl::GenericDict load(const std::string& path);
  /// Loads a file that holds only `target`'s own state (a module's state_dict or an optimizer's)
  /// into `target`, a module or an optimizer: what Python's torch.save(model.state_dict(), path)
  /// writes, from torch 1.13 or 2.x, a safetensors file (".safetensors", or a sharded model's
  /// ".safetensors.index.json"), as well as what Lockstep saves. `keys` renames a module's
  /// names first (KeyMap().rename_prefix("model.", "") for weights saved from a LightningModule's
  /// `self.model`); names or shapes that still differ are one UsageError listing them all, and
  /// without `strict` missing and unexpected names are skipped.
  ///   fabric.load_raw("weights.pt", model, true, checkpoint::KeyMap().rename_prefix("model.", ""));
  void load_raw(const std::string& path, const StateEntry& target, bool strict = true,
                const checkpoint::KeyMap& keys = {});

  /// Seeds every random generator (core/seed.h) with `seed`.
  void seed_everything(uint64_t seed);
  /// Sends `value` as `name` at `step` to every logger, on rank 0.
  void log(const std::string& name, double value, int64_t step);
  void log_dict(const std::map<std::string, double>& metrics, int64_t step);
  const std::vector<std::shared_ptr<loggers::Logger>>& loggers() const { return loggers_; }
  /// The first logger added; a UsageError when there is none.
  loggers::Logger& logger() const;

  /// Adds a callback: call(hook, ...) runs its hooks of that name, on every rank.
  void add_callback(std::shared_ptr<FabricCallback> callback);
  /// Runs hook `name` of every callback that has one, in the order they were added, with `args`
  /// (Lightning's fabric.call):  fabric.call("on_train_epoch_end", {epoch, loss});
  void call(const std::string& name, const std::vector<c10::IValue>& args = {});

 private:
  /// The part of setup_module that does not depend on the module's type.
  std::shared_ptr<strategies::WrappedModule> prepare_module(const std::shared_ptr<torch::nn::Module>& module);
  void check_module_is_ours(const strategies::Strategy& strategy) const;
  /// The plan, or a UsageError naming `call` when launch() has not run.
  const ExecutionPlan& launched(const char* call) const;
  /// `group`, or the job's group; null with one process.
  distributed::ProcessGroup* group_or_job(distributed::ProcessGroup* group) const;

  FabricOptions options_;
  std::shared_ptr<strategies::Strategy> user_strategy_;
  std::shared_ptr<environments::ClusterEnvironment> user_environment_;
  std::vector<std::shared_ptr<loggers::Logger>> loggers_;
  std::shared_ptr<checkpoint::CheckpointIO> checkpoint_io_ = std::make_shared<checkpoint::CheckpointIO>();
  std::vector<std::shared_ptr<FabricCallback>> callbacks_;
  std::optional<ExecutionPlan> plan_;
  std::unique_ptr<GradScaler> scaler_;  // 16-mixed only
  int modules_set_up_ = 0;
};

template <typename Fn>
auto Fabric::launch(Fn&& fn) -> decltype(fn(std::declval<Fabric&>())) {
  launch();
  try {
    return fn(*this);
  } catch (...) {
    // On local rank 0 of a job it started: end the workers before this rank's process group goes.
    launchers::end_launched_job(1);
    throw;
  }
}

template <typename ModuleType>
FabricModule<ModuleType> Fabric::setup_module(std::shared_ptr<ModuleType> module) {
  auto wrapped = prepare_module(module);
  return FabricModule<ModuleType>(std::move(module), std::move(wrapped), *plan_->strategy, plan_->precision);
}

template <typename ModuleType, typename... Optimizers>
auto Fabric::setup(std::shared_ptr<ModuleType> module, Optimizers... optimizers)
    -> std::tuple<FabricModule<ModuleType>, OptimizerOf<Optimizers>...> {
  static_assert(sizeof...(Optimizers) > 0, "fabric.setup(module) needs its optimizers; for a module without "
                                           "one, call fabric.setup_module(module)");
  auto wrapped = setup_module(std::move(module));
  // Braces: the optimizers are bound in the order given.
  return {std::move(wrapped), setup_optimizers(std::shared_ptr<torch::optim::Optimizer>(std::move(optimizers)))...};
}

template <typename Make>
auto Fabric::init_module(Make&& make) -> decltype(make()) {
  const auto& plan = launched("init_module");
  const auto previous = c10::get_default_dtype();
  if (plan.precision.kind() == Precision::Kind::true_64) c10::set_default_dtype(caffe2::TypeMeta::Make<double>());
  struct Restore {
    caffe2::TypeMeta dtype;
    ~Restore() { c10::set_default_dtype(dtype); }
  } restore{previous};
  auto module = make();
  plan.strategy->module_to_device(*module);
  return module;
}

template <typename Fn>
auto Fabric::rank_zero_first(Fn&& fn, bool local) -> decltype(fn()) {
  const bool first = (local ? local_rank() : global_rank()) == 0;
  if (!first) barrier("rank_zero_first");
  if constexpr (std::is_void<decltype(fn())>::value) {
    fn();
    if (first) barrier("rank_zero_first");
  } else {
    auto result = fn();
    if (first) barrier("rank_zero_first");
    return result;
  }
}

template <typename... Parts>
void Fabric::print(const Parts&... parts) const {
  if (!is_global_zero()) return;
  std::ostringstream line;
  (line << ... << parts);
  std::cout << line.str() << std::endl;
}

}  // namespace lockstep
