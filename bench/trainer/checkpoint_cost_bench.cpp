// What a checkpoint costs the Trainer (issue 42, "Losing little"): how long training stands still
// for one ModelCheckpoint save, for the benches' MLPs with Adam, on the Trainer flags' strategy
// (--devices 2 --strategy ddp: rank 0 writes the whole .ckpt; --strategy fsdp
// --fsdp-state-dict-type sharded: every rank writes its pieces). The Trainer saves every second
// step (ModelCheckpoint every_n_train_steps 2, save_top_k 1: the previous file is removed); the
// blocking time of a save is ModelCheckpoint's hook, from its start to the end of the save's
// barrier, on rank 0.
//   bench_checkpoint_cost --model 25m --saves 3 --devices 2 --strategy ddp --default-root-dir /tmp/cost
// Prints one JSON line on rank 0: the median save's seconds and each save's, the median step's
// seconds without a save, the median hook's seconds at steps without a save, the checkpoint's
// bytes on disk, and the parameter count. --train-time-interval S saves by wall time instead
// (every rank agrees on each step's decision: one all-reduce): with S larger than the run, no
// save happens, and s_per_step_mean against a run with --no-saves is that decision's cost.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <lockstep/callbacks/model_checkpoint.h>
#include <lockstep/cli/guarded_main.h>
#include <lockstep/cli/trainer_flags.h>
#include <lockstep/trainer/trainer.h>

#include "../fsdp/mlp.h"

namespace {

using namespace lockstep;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// The benches' MLPs: "small" is bench_ddp's and the Fashion-MNIST example's 784-512-256-10
// (0.5M parameters), "25m" bench_ddp's 24.2M MLP (bench/fsdp/mlp.h's).
struct Mlp : TrainingModule {
  explicit Mlp(const std::string& model)
      : net(register_module("net", std::make_shared<bench::NetImpl>(model))) {}
  torch::Tensor training_step(Batch& batch, int64_t) override {
    return torch::nn::functional::cross_entropy(net->forward(batch.data), batch.target);
  }
  OptimizerConfig configure_optimizers() override {
    return std::make_shared<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(1e-3));
  }
  std::shared_ptr<bench::NetImpl> net;
};

// When each training batch's hooks began (added before the checkpoint callback).
struct StepClock : Callback {
  std::string name() const override { return "StepClock"; }
  void on_train_batch_end(TrainerView&, TrainingModule&, const torch::Tensor&, int64_t) override {
    batch_ends.push_back(Clock::now());
  }
  std::vector<Clock::time_point> batch_ends;
};

// ModelCheckpoint, timing its hook at every batch end.
struct TimedCheckpoint : ModelCheckpoint {
  using ModelCheckpoint::ModelCheckpoint;
  void on_train_batch_end(TrainerView& trainer, TrainingModule& module, const torch::Tensor& loss,
                          int64_t batch_idx) override {
    const auto start = Clock::now();
    ModelCheckpoint::on_train_batch_end(trainer, module, loss, batch_idx);
    hook_ends.push_back(Clock::now());
    hook_seconds.push_back(std::chrono::duration<double>(hook_ends.back() - start).count());
  }
  std::vector<Clock::time_point> hook_ends;
  std::vector<double> hook_seconds;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

int64_t bytes_of(const fs::path& path) {
  if (!fs::exists(path)) return 0;
  if (!fs::is_directory(path)) return static_cast<int64_t>(fs::file_size(path));
  int64_t total = 0;
  for (const auto& entry : fs::recursive_directory_iterator(path)) {
    if (entry.is_regular_file()) total += static_cast<int64_t>(entry.file_size());
  }
  return total;
}

int run(int argc, char** argv) {
  CLI::App app{"The blocking time of a Trainer checkpoint", "bench_checkpoint_cost"};
  TrainerOptions options;
  cli::add_trainer_flags(app, options);
  std::string model = "small";
  int saves = 3;
  int64_t batch = 64;
  double interval = 0;
  app.add_option("--model", model)->check(CLI::IsMember({"small", "25m"}));
  app.add_option("--saves", saves, "checkpoints to time, one every second step")->check(CLI::Range(1, 1000));
  app.add_option("--batch", batch, "examples per rank per step")->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--train-time-interval", interval, "save by wall time, every S seconds, instead")
      ->check(CLI::NonNegativeNumber);
  bool no_saves = false;
  app.add_flag("--no-saves", no_saves, "ModelCheckpoint without saves or collectives (every_n_train_steps 10^9)");
  const int parsed = cli::parse_or_exit_code(app, argc, argv);
  if (parsed >= 0) return parsed;
  torch::set_num_threads(1);
  torch::manual_seed(0);
  const int64_t steps = 2 * saves;
  const int64_t examples = steps * batch * 16;  // room for 16 ranks
  auto data = std::make_shared<TensorDataset>(torch::randn({examples, 784}), torch::randint(10, {examples}));
  auto loader = std::make_shared<DataLoader>(data, DataLoaderOptions(batch));
  Trainer trainer(options.max_steps(steps).max_epochs(1).enable_progress_bar(false).num_sanity_val_steps(0)
                      .enable_model_summary(false));
  auto clock = std::make_shared<StepClock>();
  auto checkpoint = std::make_shared<TimedCheckpoint>(
      interval > 0 ? ModelCheckpointOptions().train_time_interval(interval).save_top_k(1)
                   : ModelCheckpointOptions().every_n_train_steps(no_saves ? 1'000'000'000 : 2).save_top_k(1));
  trainer.add_callback(clock);
  trainer.add_callback(checkpoint);
  auto net = std::make_shared<Mlp>(model);
  int64_t parameters = 0;
  for (const auto& p : net->parameters()) parameters += p.numel();
  trainer.fit(net, loader);
  if (!trainer.is_global_zero()) return 0;
  std::vector<double> save_s, step_s, hook_s;
  for (size_t k = 0; k < checkpoint->hook_seconds.size(); ++k) {
    const bool saved = interval == 0 && !no_saves && k % 2 == 1;  // steps 2, 4, ...
    (saved ? save_s : hook_s).push_back(checkpoint->hook_seconds[k]);
    if (k >= 1) step_s.push_back(std::chrono::duration<double>(clock->batch_ends[k] - checkpoint->hook_ends[k - 1]).count());
  }
  std::cout << nlohmann::json{{"bench", "checkpoint_cost"},
                              {"model", model},
                              {"parameters", parameters},
                              {"world_size", trainer.world_size()},
                              {"strategy", options.strategy()},
                              {"save_s_median", median(save_s)},
                              {"save_s", save_s},
                              {"step_s_median", median(step_s)},
                              {"hook_s_median_without_save", median(hook_s)},
                              {"train_time_interval", interval},
                              {"s_per_step_mean", std::chrono::duration<double>(clock->batch_ends.back() -
                                                                                clock->batch_ends.front()).count() /
                                                      static_cast<double>(clock->batch_ends.size() - 1)},
                              {"checkpoint_bytes", bytes_of(checkpoint->best_model_path())}}
                   .dump()
            << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return lockstep::cli::guarded_main("bench_checkpoint_cost", [&] { return run(argc, argv); });
}
