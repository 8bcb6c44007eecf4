// Trainer overhead (issue 4's question, Lightning's parity test): the same model, data order and
// optimizer, trained by lockstep::Trainer on one process and by a hand-written LibTorch loop,
// alternating A B A B; prints the median seconds per epoch of each and their ratio.
//   bench_trainer_overhead --pairs 5 --epochs 1 --batch 64
#include <algorithm>
#include <chrono>
#include <iostream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <lockstep/cli/guarded_main.h>
#include <lockstep/data/idx_examples.h>
#include <lockstep/trainer/trainer.h>

namespace {

using namespace lockstep;

// The Fashion-MNIST MLP, 784-512-256-10.
struct Mlp : TrainingModule {
  Mlp() {
    fc1 = register_module("fc1", torch::nn::Linear(784, 512));
    fc2 = register_module("fc2", torch::nn::Linear(512, 256));
    fc3 = register_module("fc3", torch::nn::Linear(256, 10));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc3(torch::relu(fc2(torch::relu(fc1(x))))); }
  torch::Tensor training_step(Batch& batch, int64_t) override {
    auto loss = torch::nn::functional::cross_entropy(forward(batch.data), batch.target);
    log("train_loss", loss);
    return loss;
  }
  OptimizerConfig configure_optimizers() override {
    return std::make_shared<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(1e-3));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int run(int argc, char** argv) {
  CLI::App app{"Trainer overhead against a hand-written loop", "bench_trainer_overhead"};
  int pairs = 5, epochs = 1;
  int64_t batch = 64;
  std::string root = "/tmp/lockstep_trainer_overhead";
  app.add_option("--pairs", pairs);
  app.add_option("--epochs", epochs);
  app.add_option("--batch", batch);
  app.add_option("--root", root, "where the Trainer's CSV logs go");
  CLI11_PARSE(app, argc, argv);
  torch::set_num_threads(1);
  auto data = std::make_shared<data::IdxExamples>(data::IdxDatasetOptions().flatten(true));
  std::vector<double> trainer_s, loop_s;
  double trainer_loss = 0, loop_loss = 0;
  for (int pair = 0; pair < pairs; ++pair) {
    for (int side = 0; side < 2; ++side) {
      const bool trainer_now = (side == 0) == (pair % 2 == 0);
      torch::manual_seed(0);
      auto model = std::make_shared<Mlp>();
      auto loader = std::make_shared<DataLoader>(data, DataLoaderOptions(batch).shuffle(true).seed(1));
      const auto start = std::chrono::steady_clock::now();
      if (trainer_now) {
        Trainer trainer(TrainerOptions()
                            .max_epochs(epochs)
                            .enable_progress_bar(false)
                            .enable_checkpointing(false)
                            .num_sanity_val_steps(0)
                            .default_root_dir(root));
        trainer.fit(model, loader);
        trainer_loss = trainer.callback_metrics().at("train_loss");
      } else {
        auto optimizer = model->configure_optimizers().optimizers[0];
        model->train();
        for (int e = 0; e < epochs; ++e) {
          loader->set_epoch(e);
          for (int64_t i = 0; i < loader->num_batches(); ++i) {
            Batch b = loader->batch(i);
            auto loss = torch::nn::functional::cross_entropy(model->forward(b.data), b.target);
            loss.backward();
            optimizer->step();
            optimizer->zero_grad();
            loop_loss = loss.item<double>();
          }
        }
      }
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / epochs;
      (trainer_now ? trainer_s : loop_s).push_back(s);
    }
  }
  const double t = median(trainer_s), l = median(loop_s);
  std::cout << nlohmann::json{{"bench", "trainer_overhead"}, {"pairs", pairs},
                              {"trainer_s_per_epoch", t}, {"loop_s_per_epoch", l},
                              {"overhead", t / l - 1.0}, {"trainer_last_loss", trainer_loss},
                              {"loop_last_loss", loop_loss}}
                   .dump()
            << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return lockstep::cli::guarded_main("bench_trainer_overhead", [&] { return run(argc, argv); });
}
