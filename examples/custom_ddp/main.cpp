// A custom DDP wrapper behind its own --strategy name (the seed's DDPPlugin.configure_ddp example).
//   build/bin/custom_ddp --devices 2 --strategy custom_ddp --max-epochs 1
//
// CountingDDP is a DistributedDataParallelBase that counts the forwards it prepared;
// CustomDDPStrategy extends DDPStrategy, returns a CountingDDP from configure_ddp and runs each
// training step's forward through it. The strategy is registered as `custom_ddp`, so the Trainer
// flags select it by name. At the end, rank 0 prints one JSON line with the count read back from
// the wrapper the strategy created.
#include <iostream>
#include <memory>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <lockstep/cli/guarded_main.h>
#include <lockstep/cli/trainer_flags.h>
#include <lockstep/core/error.h>
#include <lockstep/core/training_module.h>
#include <lockstep/data/dataset.h>
#include <lockstep/distributed/ddp/ddp.h>
#include <lockstep/strategies/ddp_strategy.h>
#include <lockstep/strategies/registry.h>
#include <lockstep/trainer/trainer.h>

namespace {

using namespace lockstep;

// The user's wrapper: DDP as usual, plus a count of the forwards it prepared.
class CountingDDP : public distributed::DistributedDataParallelBase {
 public:
  using DistributedDataParallelBase::DistributedDataParallelBase;

  // Hides (prepare_forward is not virtual) the base's: counts, then does the usual preparation.
  void prepare_forward() {
    ++prepared_forwards_;
    DistributedDataParallelBase::prepare_forward();
  }
  int64_t prepared_forwards() const { return prepared_forwards_; }

 private:
  int64_t prepared_forwards_ = 0;
};

class CustomDDPStrategy : public strategies::DDPStrategy {
 public:
  CustomDDPStrategy() : DDPStrategy(distributed::DDPOptions(), "popen", "custom_ddp") {}

  std::shared_ptr<distributed::DistributedDataParallelBase> configure_ddp(
      const std::shared_ptr<torch::nn::Module>& module, const std::vector<int>& /*device_ids*/) override {
    return std::make_shared<CountingDDP>(module, process_group(), ddp_options());
  }

  // DDPStrategy::training_step, with the forward prepared through the CountingDDP.
  torch::Tensor training_step(TrainingModule& module, Batch& batch, int64_t batch_idx) override {
    if (!module.automatic_optimization()) return module.training_step(batch, batch_idx);
    CountingDDP& wrapper = counting_ddp();
    wrapper.prepare_forward();
    torch::Tensor loss = module.training_step(batch, batch_idx);
    if (loss.defined()) wrapper.finish_forward(loss);
    return loss;
  }

  // The wrapper configure_ddp returned (after setup_module).
  CountingDDP& counting_ddp() const {
    auto* wrapper = dynamic_cast<CountingDDP*>(ddp().get());
    if (!wrapper) throw UsageError("custom_ddp: the strategy's wrapper is not a CountingDDP (or not set up yet).");
    return *wrapper;
  }
};

const bool registered = strategies::register_strategy(
    "custom_ddp", [] { return std::make_shared<CustomDDPStrategy>(); },
    "ddp with the CountingDDP wrapper of examples/custom_ddp");

// A tiny MLP on synthetic data: 16 features, 4 classes.
class TinyMlp : public TrainingModule {
 public:
  TinyMlp() {
    fc1 = register_module("fc1", torch::nn::Linear(16, 32));
    fc2 = register_module("fc2", torch::nn::Linear(32, 4));
  }
  torch::Tensor training_step(Batch& batch, int64_t) override {
    auto loss = torch::nn::functional::cross_entropy(fc2(torch::relu(fc1(batch.data))), batch.target);
    log("train_loss", loss, LogOptions().prog_bar(true));
    return loss;
  }
  OptimizerConfig configure_optimizers() override {
    return std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.1));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

int run(int argc, char** argv) {
  CLI::App app{"Train a tiny MLP with a custom DDP wrapper registered as --strategy custom_ddp", "custom_ddp"};
  TrainerOptions options;
  options.max_epochs(1);
  cli::add_trainer_flags(app, options);
  int64_t samples = 256;
  int64_t batch_size = 32;
  app.add_option("--samples", samples, "synthetic training examples (all ranks together)")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--batch-size", batch_size, "examples per batch on each process")
      ->check(CLI::PositiveNumber)->capture_default_str();
  const int parsed = cli::parse_or_exit_code(app, argc, argv);
  if (parsed >= 0) return parsed;

  // The same data on every rank (fixed generator seed); the distributed sampler splits it.
  torch::manual_seed(1234);
  auto x = torch::randn({samples, 16});
  auto y = x.narrow(1, 0, 4).argmax(1);  // learnable labels
  auto train = std::make_shared<DataLoader>(std::make_shared<TensorDataset>(x, y),
                                            DataLoaderOptions(batch_size).shuffle(true));
  Trainer trainer(options);
  trainer.fit(std::make_shared<TinyMlp>(), train);

  if (trainer.is_global_zero()) {
    auto* strategy = dynamic_cast<CustomDDPStrategy*>(&trainer.strategy());
    if (!strategy) {
      throw UsageError("custom_ddp: the Trainer runs strategy '" + trainer.strategy().name() +
                       "'; run with --strategy custom_ddp to use the CountingDDP wrapper.");
    }
    const CountingDDP& wrapper = strategy->counting_ddp();
    nlohmann::json line{{"event", "custom_ddp"},
                        {"strategy", strategy->name()},
                        {"wrapper", "CountingDDP"},
                        {"prepared_forwards", wrapper.prepared_forwards()},
                        {"train_batches", trainer.num_training_batches()},
                        {"epochs", trainer.current_epoch()},
                        {"world_size", strategy->world_size()}};
    std::cout << line.dump() << std::endl;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  (void)registered;
  return lockstep::cli::guarded_main("custom_ddp", [&] { return run(argc, argv); });
}
