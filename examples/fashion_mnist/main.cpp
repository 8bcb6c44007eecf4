// The main job: Fashion-MNIST (Debian's dataset-fashion-mnist) trained with the Trainer.
//   build/bin/fashion_mnist --devices 2 --strategy ddp --max-epochs 3
#include <iostream>

#include <torch/torch.h>

#include <lockstep/cli/guarded_main.h>
#include <lockstep/cli/trainer_flags.h>
#include <lockstep/core/error.h>
#include <lockstep/data/idx_examples.h>
#include <lockstep/trainer/trainer.h>

namespace {

using namespace lockstep;

struct Flags {
  int64_t batch_size = 64;
  double lr = 1e-3;
  std::string optimizer = "adam";
  double momentum = 0.9;
  double lr_gamma = 0.5;
  bool no_shuffle = false;
  std::string data_dir = data::kFashionMnistDirectory;
  std::string model = "mlp";
};

// 784-512-256-10 with ReLU and no dropout: tests and benchmarks rely on this shape.
struct MlpImpl : torch::nn::Module {
  MlpImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(784, 512));
    fc2 = register_module("fc2", torch::nn::Linear(512, 256));
    fc3 = register_module("fc3", torch::nn::Linear(256, 10));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = x.view({x.size(0), 784});
    return fc3(torch::relu(fc2(torch::relu(fc1(x)))));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};
TORCH_MODULE(Mlp);

// Two 3x3 convolutions with max pooling, then two linear layers.
struct CnnImpl : torch::nn::Module {
  CnnImpl() {
    conv1 = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 32, 3)));
    conv2 = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 3)));
    fc1 = register_module("fc1", torch::nn::Linear(64 * 5 * 5, 128));
    fc2 = register_module("fc2", torch::nn::Linear(128, 10));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = x.view({x.size(0), 1, 28, 28});
    x = torch::max_pool2d(torch::relu(conv1(x)), 2);
    x = torch::max_pool2d(torch::relu(conv2(x)), 2);
    return fc2(torch::relu(fc1(x.flatten(1))));
  }
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Cnn);

class Classifier : public TrainingModule {
 public:
  explicit Classifier(const Flags& flags) : flags_(flags) {
    if (flags.model == "mlp") {
      net_ = register_module("net", Mlp().ptr());
      forward_ = [this](const torch::Tensor& x) { return std::static_pointer_cast<MlpImpl>(net_)->forward(x); };
    } else if (flags.model == "cnn") {
      net_ = register_module("net", Cnn().ptr());
      forward_ = [this](const torch::Tensor& x) { return std::static_pointer_cast<CnnImpl>(net_)->forward(x); };
    } else {
      throw UsageError("--model '" + flags.model + "' is unknown: use mlp (784-512-256-10) or cnn.");
    }
    hparams() = {{"model", flags.model}, {"batch_size", flags.batch_size}, {"lr", flags.lr}, {"optimizer", flags.optimizer}};
  }

  torch::Tensor training_step(Batch& batch, int64_t) override {
    auto loss = torch::nn::functional::cross_entropy(forward_(batch.data), batch.target);
    log("train_loss", loss, LogOptions().prog_bar(true));
    return loss;
  }

  void validation_step(Batch& batch, int64_t) override {
    auto logits = forward_(batch.data);
    log("val_loss", torch::nn::functional::cross_entropy(logits, batch.target), LogOptions().sync_dist(true));
    auto accuracy = logits.argmax(1).eq(batch.target).to(torch::kFloat32).mean();
    log("val_acc", accuracy, LogOptions().sync_dist(true).prog_bar(true));
  }

  OptimizerConfig configure_optimizers() override {
    OptimizerConfig config;
    if (flags_.optimizer == "sgd") {
      config.optimizers.push_back(
          std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(flags_.lr).momentum(flags_.momentum)));
    } else {
      config.optimizers.push_back(std::make_shared<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(flags_.lr)));
    }
    // The learning rate falls by lr_gamma after every epoch but the first (LibTorch's StepLR does
    // not decay on its first step, unlike Python's): short runs end on a settled model.
    config.schedulers.push_back({std::make_shared<torch::optim::StepLR>(*config.optimizers[0], 1, flags_.lr_gamma), "epoch"});
    return config;
  }

 private:
  Flags flags_;
  std::shared_ptr<torch::nn::Module> net_;
  std::function<torch::Tensor(const torch::Tensor&)> forward_;
};

int run(int argc, char** argv) {
  CLI::App app{"Train a classifier on Fashion-MNIST with Lockstep", "fashion_mnist"};
  TrainerOptions options;
  options.max_epochs(3);
  cli::add_trainer_flags(app, options);
  Flags flags;
  app.add_option("--batch-size", flags.batch_size, "examples per batch on each process")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30))->capture_default_str();
  app.add_option("--lr", flags.lr, "learning rate")->check(CLI::Range(1e-12, 1e6))->capture_default_str();
  app.add_option("--optimizer", flags.optimizer, "adam|sgd")->check(CLI::IsMember({"adam", "sgd"}))->capture_default_str();
  app.add_option("--momentum", flags.momentum, "SGD momentum")->check(CLI::Range(0.0, 1.0))->capture_default_str();
  app.add_option("--lr-gamma", flags.lr_gamma,
                 "learning-rate factor after each epoch from the second on (LibTorch's StepLR skips its first "
                 "step; 1: constant)")
      ->check(CLI::Range(0.0, 1.0))->capture_default_str();
  app.add_flag("--no-shuffle", flags.no_shuffle, "keep the training set's order");
  app.add_option("--data-dir", flags.data_dir, "folder with the *-idx?-ubyte(.gz) files")->capture_default_str();
  app.add_option("--model", flags.model, "mlp|cnn")->check(CLI::IsMember({"mlp", "cnn"}))->capture_default_str();
  const int parsed = cli::parse_or_exit_code(app, argc, argv);
  if (parsed >= 0) return parsed;

  auto options_for = [&](data::Split split) {
    return data::IdxDatasetOptions().directory(flags.data_dir).split(split).flatten(flags.model == "mlp");
  };
  auto train = std::make_shared<DataLoader>(std::make_shared<data::IdxExamples>(options_for(data::Split::Train)),
                                            DataLoaderOptions(flags.batch_size).shuffle(!flags.no_shuffle).seed(
                                                options.seed() >= 0 ? options.seed() : 0));
  auto val = std::make_shared<DataLoader>(std::make_shared<data::IdxExamples>(options_for(data::Split::Test)),
                                          DataLoaderOptions(256));
  auto model = std::make_shared<Classifier>(flags);
  Trainer trainer(options);
  trainer.fit(model, train, val);
  if (trainer.is_global_zero()) {
    const auto& m = trainer.callback_metrics();
    std::cerr << "fashion_mnist: val_acc " << (m.count("val_acc") ? m.at("val_acc") : 0.0) << " after "
              << trainer.current_epoch() << " epoch(s) on " << trainer.strategy().world_size() << " process(es)\n"
              << "fashion_mnist: logs in " << trainer.log_dir() << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return lockstep::cli::guarded_main("fashion_mnist", [&] { return run(argc, argv); }); }
