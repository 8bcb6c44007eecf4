// README's "your own model" example, built so that it stays true.
#include <lockstep/lockstep.h>
using namespace lockstep;

struct Net : TrainingModule {
  Net() { fc1 = register_module("fc1", torch::nn::Linear(784, 128));
          fc2 = register_module("fc2", torch::nn::Linear(128, 10)); }
  torch::Tensor training_step(Batch& b, int64_t) override {
    auto loss = torch::nn::functional::cross_entropy(fc2(torch::relu(fc1(b.data))), b.target);
    log("train_loss", loss, LogOptions().prog_bar(true));
    return loss;
  }
  OptimizerConfig configure_optimizers() override {
    return std::make_shared<torch::optim::Adam>(parameters(), 1e-3);
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

int main(int argc, char** argv) {
  return cli::guarded_main("net", [&] {
    CLI::App app{"my training job"};
    TrainerOptions options;
    cli::add_trainer_flags(app, options);          // --devices 2 --strategy ddp --max-epochs 3 ...
    if (int code = cli::parse_or_exit_code(app, argc, argv); code >= 0) return code;
    // Fashion-MNIST images are [N, 1, 28, 28]; flatten(true) makes them 784 values for the Linear layer.
    auto images = std::make_shared<data::IdxExamples>(data::IdxDatasetOptions().flatten(true));
    Trainer trainer(options);
    trainer.fit(std::make_shared<Net>(), std::make_shared<DataLoader>(images, DataLoaderOptions(64).shuffle(true)));
    return 0;
  });
}
