// DDP training throughput of Lockstep, the C++ side of bench/ddp/ddp_bench.py (PyTorch DDP):
// same MLP, same initial weights (seeded the same way), same synthetic batches, same SGD, gloo.
//   bench_ddp --model small|25m --nproc-per-node 2 --steps 100 --warmup 10 --batch 64
// Prints one JSON line on rank 0: steps/s over the timed steps and the final loss.
#include <chrono>
#include <iostream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <lockstep/cli/guarded_main.h>
#include <lockstep/distributed/collectives.h>
#include <lockstep/distributed/ddp.h>
#include <lockstep/environments/cluster_environment.h>
#include <lockstep/launchers/subprocess_launcher.h>

namespace {

using namespace lockstep;

// Layer widths: "small" is the Fashion-MNIST MLP; "25m" has 24.2M parameters.
std::vector<int64_t> widths(const std::string& model) {
  if (model == "small") return {784, 512, 256, 10};
  if (model == "25m") return {784, 4096, 4096, 1024, 10};
  throw std::invalid_argument("--model: use small or 25m");
}

struct MlpImpl : torch::nn::Module {
  explicit MlpImpl(const std::vector<int64_t>& w) {
    for (size_t i = 0; i + 1 < w.size(); ++i) {
      layers.push_back(register_module("fc" + std::to_string(i + 1), torch::nn::Linear(w[i], w[i + 1])));
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    for (size_t i = 0; i < layers.size(); ++i) {
      x = layers[i]->forward(x);
      if (i + 1 < layers.size()) x = torch::relu(x);
    }
    return x;
  }
  std::vector<torch::nn::Linear> layers;
};

int run(int argc, char** argv) {
  CLI::App app{"Lockstep DDP throughput", "bench_ddp"};
  std::string model = "small";
  int nproc = 2, steps = 100, warmup = 10;
  int64_t batch = 64;
  double bucket_cap_mb = 25;
  bool view = true;
  app.add_option("--model", model)->check(CLI::IsMember({"small", "25m"}));
  app.add_option("--nproc-per-node", nproc);
  app.add_option("--steps", steps);
  app.add_option("--warmup", warmup);
  app.add_option("--batch", batch, "examples per rank per step");
  app.add_option("--bucket-cap-mb", bucket_cap_mb);
  app.add_option("--gradient-as-bucket-view", view);
  CLI11_PARSE(app, argc, argv);

  auto env = environments::detect_environment(environments::Environ::from_process());
  if (!env->creates_processes_externally() && nproc > 1) {
    launchers::SubprocessLauncher(launchers::LaunchOptions().nproc_per_node(nproc).master_port(env->main_port())).launch();
    env = environments::detect_environment(environments::Environ::from_process());
  }
  torch::set_num_threads(1);
  auto group = distributed::ProcessGroup::init(distributed::ProcessGroupOptions(env->global_rank(), env->world_size())
                                                   .main_address(env->main_address())
                                                   .main_port(env->main_port())
                                                   .timeout(std::chrono::seconds(300)));
  const auto w = widths(model);
  torch::manual_seed(0);
  auto net = std::make_shared<MlpImpl>(w);
  distributed::DistributedDataParallel<MlpImpl> ddp(
      net, *group, distributed::DDPOptions().bucket_cap_mb(bucket_cap_mb).gradient_as_bucket_view(view));
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.01));
  // Each rank's batches: a fixed generator per rank, the same on the Python side.
  auto generator = at::make_generator<at::CPUGeneratorImpl>(1000 + group->rank());
  std::vector<torch::Tensor> xs, ys;
  for (int i = 0; i < 8; ++i) {
    xs.push_back(torch::randn({batch, w.front()}, generator));
    ys.push_back(torch::randint(w.back(), {batch}, generator, torch::kInt64));
  }
  double loss_value = 0;
  auto step = [&](int i) {
    auto loss = torch::nn::functional::cross_entropy(ddp.forward(xs[i % 8]), ys[i % 8]);
    optimizer.zero_grad();
    loss.backward();
    optimizer.step();
    loss_value = loss.item<double>();
  };
  for (int i = 0; i < warmup; ++i) step(i);
  distributed::barrier(*group, "timed_start");
  const auto start = std::chrono::steady_clock::now();
  for (int i = warmup; i < warmup + steps; ++i) step(i);
  distributed::barrier(*group, "timed_end");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  auto loss = distributed::all_reduce(*group, torch::tensor({loss_value}, torch::kFloat64));
  if (group->rank() == 0) {
    std::cout << nlohmann::json{{"impl", "lockstep"}, {"model", model},  {"world_size", group->world_size()},
                                {"steps", steps},     {"batch", batch},  {"steps_per_s", steps / seconds},
                                {"loss", loss.item<double>()}}
                     .dump()
              << std::endl;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return lockstep::cli::guarded_main("bench_ddp", [&] { return run(argc, argv); }); }
