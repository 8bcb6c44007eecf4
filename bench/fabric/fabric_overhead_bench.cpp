// Fabric overhead: the Fashion-MNIST MLP on 2 processes, trained by a loop through Fabric and by
// the hand-written DDP loop of the user guide ("DDP without the Trainer"): same data order, same
// SGD, both started by `lockstep launch`, alternating A B B A ...; prints the median steps/s of
// each and their ratio (Fabric / hand-written).
//   bench_fabric_overhead --pairs 5 --steps 300 --warmup 20 --batch 64
// With --side fabric|plain it is one side's worker (what the driver launches).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <lockstep/cli/guarded_main.h>
#include <lockstep/core/error.h>
#include <lockstep/data/idx_examples.h>
#include <lockstep/distributed/collectives.h>
#include <lockstep/distributed/ddp/ddp.h>
#include <lockstep/environments/cluster_environment.h>
#include <lockstep/fabric/fabric.h>

namespace {

using namespace lockstep;

struct NetImpl : torch::nn::Module {
  NetImpl()
      : fc1(register_module("fc1", torch::nn::Linear(784, 512))),
        fc2(register_module("fc2", torch::nn::Linear(512, 256))),
        fc3(register_module("fc3", torch::nn::Linear(256, 10))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc3(torch::relu(fc2(torch::relu(fc1(x))))); }
  torch::nn::Linear fc1, fc2, fc3;
};

struct Settings {
  int64_t steps = 300, warmup = 20, batch = 64;
};

std::shared_ptr<DataLoader> fashion_mnist(int64_t batch) {
  auto images = std::make_shared<data::IdxExamples>(data::IdxDatasetOptions().flatten(true));
  return std::make_shared<DataLoader>(images, DataLoaderOptions(batch).shuffle(true).seed(42));
}

// Steps/s over the timed steps, rank 0's clock between two barriers.
template <typename Step, typename Barrier>
double time_steps(const Settings& s, Step&& step, Barrier&& barrier) {
  for (int64_t i = 0; i < s.warmup; ++i) step(i);
  barrier("timed_start");
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = s.warmup; i < s.warmup + s.steps; ++i) step(i);
  barrier("timed_end");
  return static_cast<double>(s.steps) / std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double fabric_side(const Settings& s, double* loss_out) {
  Fabric fabric(FabricOptions().accelerator("cpu"));
  fabric.launch();
  torch::manual_seed(0);
  auto net = std::make_shared<NetImpl>();
  auto [model, optimizer] = fabric.setup(net, std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.05)));
  auto loader = fabric.setup_dataloaders(fashion_mnist(s.batch));
  double loss_value = 0;
  // Structured bindings are captured by name only from C++20 (clang refuses it in C++17).
  auto step = [&, &model = model, &optimizer = optimizer](int64_t i) {
    Batch batch = loader.batch(i % loader.num_batches());
    auto loss = torch::nn::functional::cross_entropy(model(batch.data), batch.target);
    optimizer.zero_grad();
    fabric.backward(loss);
    optimizer.step();
    loss_value = loss.item<double>();
  };
  const double rate = time_steps(s, step, [&](const char* name) { fabric.barrier(name); });
  *loss_out = fabric.all_reduce(loss_value);
  return fabric.is_global_zero() ? rate : -1;
}

// The user guide's loop, unchanged but for the timing.
double plain_side(const Settings& s, double* loss_out) {
  auto env = environments::detect_environment(environments::Environ::from_process());
  auto group = distributed::ProcessGroup::init(env->process_group_options().timeout(std::chrono::seconds(300)));
  torch::manual_seed(0);
  auto net = std::make_shared<NetImpl>();
  distributed::DistributedDataParallel<NetImpl> ddp(net, *group);
  torch::optim::SGD opt(ddp.parameters(), torch::optim::SGDOptions(0.05));
  auto loader = fashion_mnist(s.batch);
  loader->set_sampler(std::make_shared<distributed::DistributedSampler>(
      loader->dataset()->size(), distributed::SamplerOptions(group->world_size(), group->rank()).seed(42)));
  double loss_value = 0;
  auto step = [&](int64_t i) {
    Batch batch = loader->batch(i % loader->num_batches());
    auto loss = torch::nn::functional::cross_entropy(ddp(batch.data), batch.target);
    opt.zero_grad();
    loss.backward();
    opt.step();
    loss_value = loss.item<double>();
  };
  const double rate = time_steps(s, step, [&](const char* name) { distributed::barrier(*group, name); });
  *loss_out = distributed::all_reduce(*group, torch::tensor({loss_value}, torch::kFloat64)).item<double>();
  return group->rank() == 0 ? rate : -1;
}

// One launch of a side: its rank 0's JSON line.
nlohmann::json run_side(const std::string& side, const Settings& s) {
  char self[4096] = {};
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  LOCKSTEP_CHECK(n > 0, UsageError, "bench_fabric_overhead: cannot read /proc/self/exe.");
  const std::string exe(self, static_cast<size_t>(n));
  const std::string bin = exe.substr(0, exe.find_last_of('/'));
  const std::string cmd = bin + "/lockstep launch --nproc-per-node 2 -- " + exe + " --side " + side + " --steps " +
                          std::to_string(s.steps) + " --warmup " + std::to_string(s.warmup) + " --batch " +
                          std::to_string(s.batch);
  FILE* pipe = ::popen(cmd.c_str(), "r");
  LOCKSTEP_CHECK(pipe, UsageError, "bench_fabric_overhead: cannot run ", cmd);
  std::string out;
  char buffer[4096];
  while (size_t got = std::fread(buffer, 1, sizeof(buffer), pipe)) out.append(buffer, got);
  const int status = ::pclose(pipe);
  const auto start = out.rfind("{\"");
  LOCKSTEP_CHECK(status == 0 && start != std::string::npos, UsageError, "bench_fabric_overhead: ", cmd,
                 " failed (status ", status, "):\n", out);
  return nlohmann::json::parse(out.substr(start));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

int run(int argc, char** argv) {
  CLI::App app{"Fabric loop against the hand-written DDP loop", "bench_fabric_overhead"};
  Settings s;
  int pairs = 5;
  std::string side;
  app.add_option("--pairs", pairs)->check(CLI::Range(1, 100));
  app.add_option("--steps", s.steps)->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  app.add_option("--warmup", s.warmup)->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  app.add_option("--batch", s.batch)->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--side", side, "run one side's worker: fabric|plain")->check(CLI::IsMember({"fabric", "plain"}));
  CLI11_PARSE(app, argc, argv);
  torch::set_num_threads(1);
  if (!side.empty()) {
    double loss = 0;
    const double rate = side == "fabric" ? fabric_side(s, &loss) : plain_side(s, &loss);
    if (rate > 0) std::cout << nlohmann::json{{"side", side}, {"steps_per_s", rate}, {"loss", loss}}.dump() << std::endl;
    return 0;
  }
  std::vector<double> fabric, plain;
  double fabric_loss = 0, plain_loss = 0;
  for (int pair = 0; pair < pairs; ++pair) {
    for (const std::string& which : pair % 2 == 0 ? std::vector<std::string>{"fabric", "plain"}
                                                   : std::vector<std::string>{"plain", "fabric"}) {
      const auto result = run_side(which, s);
      (which == "fabric" ? fabric : plain).push_back(result["steps_per_s"].get<double>());
      (which == "fabric" ? fabric_loss : plain_loss) = result["loss"].get<double>();
    }
  }
  const double f = median(fabric), p = median(plain);
  std::cout << nlohmann::json{{"bench", "fabric_overhead"}, {"pairs", pairs}, {"steps", s.steps},
                              {"batch", s.batch}, {"world_size", 2}, {"fabric_steps_per_s", f},
                              {"plain_steps_per_s", p}, {"ratio", f / p}, {"fabric_runs", fabric},
                              {"plain_runs", plain}, {"fabric_last_loss", fabric_loss},
                              {"plain_last_loss", plain_loss}}
                   .dump()
            << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return lockstep::cli::guarded_main("bench_fabric_overhead", [&] { return run(argc, argv); });
}
