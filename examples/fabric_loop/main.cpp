// The main job (Fashion-MNIST, as examples/fashion_mnist) in a hand-written loop through Fabric:
// the same model, flags and data order, so that with SGD and --no-shuffle both end with the same
// parameters. Saves <default-root-dir>/checkpoints/last.ckpt (parameters under "state_dict").
//   build/bin/fabric_loop --devices 2 --strategy ddp --max-epochs 3
#include <iostream>

#include <torch/torch.h>

#include <lockstep/cli/guarded_main.h>
#include <lockstep/cli/trainer_flags.h>
#include <lockstep/core/error.h>
#include <lockstep/data/idx_examples.h>
#include <lockstep/fabric/fabric.h>
#include <lockstep/loggers/csv_logger.h>

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
  int64_t max_epochs = 3;
  int64_t max_steps = -1;
  int64_t accumulate_grad_batches = 1;
  double gradient_clip_val = 0;
  std::string default_root_dir = ".";
  int64_t seed = -1;
};

// examples/fashion_mnist's two models, layer for layer.
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

// Mean loss and accuracy over the test set, all ranks together.
template <typename Model>
std::pair<double, double> evaluate(Fabric& fabric, Model& model, FabricDataLoader& val) {
  torch::NoGradGuard no_grad;
  model->eval();
  double loss_sum = 0, correct = 0, examples = 0;
  for (int64_t i = 0; i < val.num_batches(); ++i) {
    Batch batch = val.batch(i);
    torch::Tensor logits = model(batch.data);
    loss_sum += torch::nn::functional::cross_entropy(logits, batch.target).item<double>() * batch.size();
    correct += logits.argmax(1).eq(batch.target).sum().item<double>();
    examples += batch.size();
  }
  model->train();
  const auto sums = fabric.all_reduce(torch::tensor({loss_sum, correct, examples}, torch::kFloat64),
                                      distributed::ReduceOp::sum);
  return {sums[0].item<double>() / sums[2].item<double>(), sums[1].item<double>() / sums[2].item<double>()};
}

template <typename Net>
int train(Fabric& fabric, const Flags& flags, std::shared_ptr<Net> net) {
  std::shared_ptr<torch::optim::Optimizer> optimizer;
  if (flags.optimizer == "sgd") {
    optimizer = std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(flags.lr).momentum(flags.momentum));
  } else {
    optimizer = std::make_shared<torch::optim::Adam>(net->parameters(), torch::optim::AdamOptions(flags.lr));
  }
  auto [model, opt] = fabric.setup(net, optimizer);
  // As the Trainer steps fashion_mnist's StepLR: after every epoch, decaying from the second on.
  torch::optim::StepLR schedule(*optimizer, 1, flags.lr_gamma);

  auto data_for = [&](data::Split split) {
    return std::make_shared<data::IdxExamples>(
        data::IdxDatasetOptions().directory(flags.data_dir).split(split).flatten(flags.model == "mlp"));
  };
  auto train_loader = fabric.setup_dataloaders(std::make_shared<DataLoader>(
      data_for(data::Split::Train),
      DataLoaderOptions(flags.batch_size).shuffle(!flags.no_shuffle).seed(flags.seed >= 0 ? flags.seed : 0)));
  auto val_loader = fabric.setup_dataloaders(std::make_shared<DataLoader>(data_for(data::Split::Test), DataLoaderOptions(256)));

  const int64_t accumulate = flags.accumulate_grad_batches;
  int64_t step = 0, epoch = 0;
  double val_acc = 0;
  for (; epoch < flags.max_epochs; ++epoch) {
    if (flags.max_steps >= 0 && step >= flags.max_steps) break;
    train_loader.set_epoch(epoch);
    for (int64_t i = 0; i < train_loader.num_batches(); ++i) {
      Batch batch = train_loader.batch(i);
      const bool stepping = (i + 1) % accumulate == 0 || i + 1 == train_loader.num_batches();
      {
        auto no_sync = fabric.no_backward_sync(model, !stepping);
        torch::Tensor loss = torch::nn::functional::cross_entropy(model(batch.data), batch.target);
        fabric.backward(accumulate > 1 ? loss / static_cast<double>(accumulate) : loss);
        if (stepping && step % 50 == 0) fabric.log("train_loss", loss.item<double>(), step);
      }
      if (!stepping) continue;
      if (flags.gradient_clip_val > 0) fabric.clip_gradients(opt, flags.gradient_clip_val);
      opt.step();
      opt.zero_grad();
      if (++step == flags.max_steps) break;
    }
    schedule.step();
    const auto [val_loss, accuracy] = evaluate(fabric, model, val_loader);
    val_acc = accuracy;
    fabric.log_dict({{"val_loss", val_loss}, {"val_acc", val_acc}, {"epoch", static_cast<double>(epoch)}}, step);
  }
  fabric.save(flags.default_root_dir + "/checkpoints/last.ckpt",
              {{"state_dict", model}, {"optimizer", opt}, {"epoch", epoch}, {"global_step", step}});
  fabric.print("fabric_loop: val_acc ", val_acc, " after ", epoch, " epoch(s), ", step, " step(s) on ",
               fabric.world_size(), " process(es); checkpoint ", flags.default_root_dir, "/checkpoints/last.ckpt");
  return 0;
}

int run(int argc, char** argv) {
  CLI::App app{"Train a classifier on Fashion-MNIST in a hand-written loop through Fabric", "fabric_loop"};
  FabricOptions options;
  Flags flags;
  cli::add_fabric_flags(app, options, flags.seed);
  app.add_option("--batch-size", flags.batch_size, "examples per batch on each process")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30))->capture_default_str();
  app.add_option("--lr", flags.lr, "learning rate")->check(CLI::Range(1e-12, 1e6))->capture_default_str();
  app.add_option("--optimizer", flags.optimizer, "adam|sgd")->check(CLI::IsMember({"adam", "sgd"}))->capture_default_str();
  app.add_option("--momentum", flags.momentum, "SGD momentum")->check(CLI::Range(0.0, 1.0))->capture_default_str();
  app.add_option("--lr-gamma", flags.lr_gamma, "learning-rate factor after each epoch from the second on (1: constant)")
      ->check(CLI::Range(0.0, 1.0))->capture_default_str();
  app.add_flag("--no-shuffle", flags.no_shuffle, "keep the training set's order");
  app.add_option("--data-dir", flags.data_dir, "folder with the *-idx?-ubyte(.gz) files")->capture_default_str();
  app.add_option("--model", flags.model, "mlp|cnn")->check(CLI::IsMember({"mlp", "cnn"}))->capture_default_str();
  app.add_option("--max-epochs", flags.max_epochs, "stop after this many epochs")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40))->capture_default_str();
  app.add_option("--max-steps", flags.max_steps, "stop after this many optimizer steps (-1: no limit)")
      ->check(CLI::Range(int64_t{-1}, int64_t{1} << 50))->capture_default_str();
  app.add_option("--accumulate-grad-batches", flags.accumulate_grad_batches, "batches per optimizer step")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))->capture_default_str();
  app.add_option("--gradient-clip-val", flags.gradient_clip_val, "clip gradients to this norm (0: off)")
      ->check(CLI::Range(0.0, 1e12))->capture_default_str();
  app.add_option("--default-root-dir", flags.default_root_dir, "where logs and checkpoints go")->capture_default_str();
  const int parsed = cli::parse_or_exit_code(app, argc, argv);
  if (parsed >= 0) return parsed;

  Fabric fabric(options);
  fabric.add_logger(std::make_shared<loggers::CSVLogger>(loggers::LoggerOptions(flags.default_root_dir)));
  return fabric.launch([&](Fabric& f) {
    // Built after --seed, before anything else draws from the generator: fashion_mnist's weights.
    if (flags.model == "cnn") return train(f, flags, std::make_shared<CnnImpl>());
    return train(f, flags, std::make_shared<MlpImpl>());
  });
}

}  // namespace

int main(int argc, char** argv) { return lockstep::cli::guarded_main("fabric_loop", [&] { return run(argc, argv); }); }
