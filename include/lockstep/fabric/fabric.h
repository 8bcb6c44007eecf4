#pragma once
/// Fabric: distributed training in your own loop (Lightning Fabric). The Trainer's options,
/// environment detection, launchers, strategies, precision and checkpoint format, without its
/// loops: you keep the loop, Fabric makes it run on one process or many.

#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/ivalue.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/optimizer.h>

#include <lockstep/data/data_loader.h>
#include <lockstep/distributed/collectives.h>
#include <lockstep/fabric/fabric_module.h>
#include <lockstep/fabric/fabric_options.h>
#include <lockstep/fabric/fabric_state.h>
#include <lockstep/launchers/launcher.h>
#include <lockstep/loggers/logger.h>
#include <lockstep/strategies/strategy.h>
#include <lockstep/trainer/connector.h>
#include <lockstep/trainer/grad_scaler.h>

namespace lockstep {

/// While alive, backward passes accumulate gradients on each rank without communicating; the
/// first backward after it reduces the sum (gradient accumulation). Inert when not `enabled`.
class NoBackwardSync {
 public:
  NoBackwardSync(strategies::Strategy& strategy, bool enabled);
  ~NoBackwardSync();
  NoBackwardSync(const NoBackwardSync&) = delete;
  NoBackwardSync& operator=(const NoBackwardSync&) = delete;

 private:
  strategies::Strategy& strategy_;
  bool enabled_;
};

/// What Fabric::setup returns: `auto [model, optimizer] = fabric.setup(net, sgd);`
template <typename ModuleType>
struct FabricSetup {
  FabricModule<ModuleType> module;
  FabricOptimizer optimizer;
};

///   Fabric fabric(FabricOptions().devices("2").strategy("ddp"));
///   fabric.launch();                                   // starts rank 1; both continue here
///   auto sgd = std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.1));
///   auto [model, optimizer] = fabric.setup(net, sgd);
///   auto loader = fabric.setup_dataloaders(train);    // this rank's share, on the device
///   for (int64_t i = 0; i < loader.num_batches(); ++i) {
///     Batch batch = loader.batch(i);
///     auto loss = torch::nn::functional::cross_entropy(model(batch.data), batch.target);
///     optimizer.zero_grad();
///     fabric.backward(loss);                           // gradients averaged over the ranks
///     optimizer.step();
///   }
///   fabric.save("last.ckpt", {{"state_dict", model}, {"optimizer", optimizer}});
///
/// Every rank must make the same calls of setup, backward, save, load and the collectives, in
/// the same order. Bad options are UsageErrors (exit code 2 under cli::guarded_main).
class Fabric {
 public:
  explicit Fabric(FabricOptions options = {});
  /// Finalizes the loggers on rank 0.
  ~Fabric();
  Fabric(const Fabric&) = delete;
  Fabric& operator=(const Fabric&) = delete;

  /// A Strategy object instead of the strategy name (a DDPStrategy with its own configure_ddp or
  /// DDPOptions); before launch().
  void set_strategy(std::shared_ptr<strategies::Strategy> strategy);
  /// Where log() and log_dict() go (rank 0 writes). Default: none.
  void add_logger(std::shared_ptr<loggers::Logger> logger);

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
  /// strategy (DDP, one DDP per child for ddp_separate, or a custom configure_ddp), and binds
  /// `optimizer` (made on the module's parameters) to the precision. One module per Fabric.
  template <typename ModuleType>
  FabricSetup<ModuleType> setup(std::shared_ptr<ModuleType> module, std::shared_ptr<torch::optim::Optimizer> optimizer);
  template <typename ModuleType>
  FabricSetup<ModuleType> setup(const torch::nn::ModuleHolder<ModuleType>& module,
                                std::shared_ptr<torch::optim::Optimizer> optimizer) {
    return setup(module.ptr(), std::move(optimizer));
  }
  /// The module part of setup, for an optimizer made afterwards (setup_optimizer).
  template <typename ModuleType>
  FabricModule<ModuleType> setup_module(std::shared_ptr<ModuleType> module);
  FabricOptimizer setup_optimizer(std::shared_ptr<torch::optim::Optimizer> optimizer);
  /// Puts a DistributedSampler on `loader` under DDP (unless it has a sampler: the loader's
  /// shuffle and seed order the epochs), and returns it with batches moved to the device.
  FabricDataLoader setup_dataloaders(std::shared_ptr<DataLoader> loader);

  /// loss.backward() through the strategy: DDP reduces the gradients during it; under 16-mixed
  /// the loss is scaled first.
  void backward(const torch::Tensor& loss);
  /// Clips the gradients of `optimizer`'s parameters to a total `max_norm` (of `norm_type`);
  /// returns the norm before clipping. Under 16-mixed the gradients are unscaled first.
  torch::Tensor clip_gradients(FabricOptimizer& optimizer, double max_norm, double norm_type = 2.0);
  /// Clamps every gradient element of `optimizer`'s parameters to [-clip_val, clip_val].
  void clip_gradients_value(FabricOptimizer& optimizer, double clip_val);
  /// Accumulation without communication while the guard lives (when `enabled`):
  ///   { auto guard = fabric.no_backward_sync(model, i % 4 != 3); fabric.backward(loss); }
  template <typename ModuleType>
  NoBackwardSync no_backward_sync(const FabricModule<ModuleType>& module, bool enabled = true) {
    check_module_is_ours(module.strategy());
    return NoBackwardSync(module.strategy(), enabled);
  }
  /// The precision's autocast while the scope lives (bf16-mixed, 16-mixed; inert otherwise), for
  /// code outside the module's forward, such as a loss.
  Precision::StepScope autocast() const;

  // Across ranks; every rank must call, in the same order.
  /// `tensor` reduced over the ranks (mean, sum, max, min, product); `tensor` itself is unchanged.
  torch::Tensor all_reduce(const torch::Tensor& tensor, distributed::ReduceOp op = distributed::ReduceOp::mean);
  double all_reduce(double value, distributed::ReduceOp op = distributed::ReduceOp::mean);
  /// Every rank's `tensor` stacked in rank order: shape (world_size, ...); equal shapes needed.
  torch::Tensor all_gather(const torch::Tensor& tensor);
  /// Rank `src`'s tensor on every rank, on this rank's device.
  torch::Tensor broadcast(const torch::Tensor& tensor, int src = 0);
  /// Rank `src`'s value on every rank: a string, a number, a list or dict of them.
  c10::IValue broadcast(const c10::IValue& value, int src = 0);
  /// Waits until every rank arrived at the barrier `name`.
  void barrier(const std::string& name = "fabric");

  // This process in the job (known after launch()).
  int global_rank() const;
  int local_rank() const;
  int node_rank() const;
  int world_size() const;
  bool is_global_zero() const { return global_rank() == 0; }
  /// The device this rank computes on.
  torch::Device device() const;
  strategies::Strategy& strategy() const;
  /// Prints the parts and a newline to stdout, on rank 0 only.
  template <typename... Parts>
  void print(const Parts&... parts) const;

  /// Writes `state` to `path` in the Trainer's checkpoint format (Python's torch.load reads it):
  /// modules as their state_dict, optimizers in Python's layout, values as they are. Rank 0
  /// writes, atomically; every rank waits for it.
  void save(const std::string& path, const FabricState& state);
  /// Restores every entry of `state` from the checkpoint at `path` (modules and optimizers in
  /// place, values replaced), on every rank. Returns the checkpoint's other entries. A missing
  /// file or key is a UsageError naming it.
  c10::impl::GenericDict load(const std::string& path, FabricState& state);

  /// Seeds every random generator (core/seed.h) with `seed`.
  void seed_everything(uint64_t seed);
  /// Sends `value` as `name` at `step` to every logger, on rank 0.
  void log(const std::string& name, double value, int64_t step);
  void log_dict(const std::map<std::string, double>& metrics, int64_t step);
  const std::vector<std::shared_ptr<loggers::Logger>>& loggers() const { return loggers_; }

 private:
  /// The part of setup_module that does not depend on the module's type.
  void prepare_module(const std::shared_ptr<torch::nn::Module>& module);
  void check_module_is_ours(const strategies::Strategy& strategy) const;
  /// The plan, or a UsageError naming `call` when launch() has not run.
  const ExecutionPlan& launched(const char* call) const;

  FabricOptions options_;
  std::shared_ptr<strategies::Strategy> user_strategy_;
  std::vector<std::shared_ptr<loggers::Logger>> loggers_;
  std::optional<ExecutionPlan> plan_;
  std::unique_ptr<GradScaler> scaler_;  // 16-mixed only
  bool module_set_up_ = false;
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
  prepare_module(module);
  return FabricModule<ModuleType>(std::move(module), *plan_->strategy, plan_->precision);
}

template <typename ModuleType>
FabricSetup<ModuleType> Fabric::setup(std::shared_ptr<ModuleType> module,
                                      std::shared_ptr<torch::optim::Optimizer> optimizer) {
  auto wrapped = setup_module(std::move(module));
  return {std::move(wrapped), setup_optimizer(std::move(optimizer))};
}

template <typename... Parts>
void Fabric::print(const Parts&... parts) const {
  if (!is_global_zero()) return;
  std::ostringstream line;
  (line << ... << parts);
  std::cout << line.str() << std::endl;
}

}  // namespace lockstep
