// A training program under a per-process memory cap, for the "does not fit" test of sharded
// training (tests/unit/distributed/fsdp/memory_cap_test.cpp):
//   sharded_memory_cap DDP|FULL_SHARD NPROC CAP_MB STEPS WIDTH LAYERS
// Launches NPROC ranks (LocalLauncher, re-executed). Each rank, once LibTorch and the process
// group are up, caps its own address space (RLIMIT_AS, what `prlimit --as` sets) at what it has
// mapped then plus CAP_MB (0: no cap): LibTorch maps hundreds of MB before any model, more in a
// CUDA build, so a cap relative to that floor means the same on every build. Then it builds the
// MLP 784-WIDTH x LAYERS-10 as a torch::nn::Sequential, wraps it (Lockstep's DDP, or
// FullyShardedDataParallel FULL_SHARD with every hidden Linear a unit), and trains STEPS Adam
// steps on batch 64 per rank. Every rank prints "rank R: address space +A MB over its floor,
// peak RSS P MB"; rank 0 then prints "trained STEPS steps, loss L". A failed allocation ends the
// job through guarded_main (exit 1, "... can't allocate memory ..." from LibTorch's allocator).
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>

#include <torch/torch.h>

#include <lockstep/cli/guarded_main.h>
#include <lockstep/core/heap.h>
#include <lockstep/distributed/collectives.h>
#include <lockstep/distributed/ddp/ddp.h>
#include <lockstep/distributed/fsdp/fully_sharded.h>
#include <lockstep/environments/cluster_environment.h>
#include <lockstep/environments/torchelastic_environment.h>
#include <lockstep/launchers/local_launcher.h>

namespace {

using namespace lockstep;

// A field of /proc/self/status in MB ("VmSize", "VmPeak", "VmHWM").
double status_mb(const std::string& field) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(field + ":", 0) == 0) return std::stod(line.substr(field.size() + 1)) / 1024.0;  // kB
  }
  return 0;
}

struct NetImpl : torch::nn::Module {
  NetImpl(int64_t width, int layers) {
    int64_t in = 784;
    for (int i = 0; i < layers; ++i) {
      net->push_back(torch::nn::Linear(in, width));
      net->push_back(torch::nn::ReLU());
      in = width;
    }
    net->push_back(torch::nn::Linear(in, 10));
    register_module("net", net);
  }
  torch::Tensor forward(torch::Tensor x) { return net->forward(x); }
  torch::nn::Sequential net;
};

int run(int argc, char** argv) {
  if (argc != 7) throw UsageError("usage: sharded_memory_cap DDP|FULL_SHARD NPROC CAP_MB STEPS WIDTH LAYERS");
  const std::string sharding = argv[1];
  const int nproc = std::stoi(argv[2]);
  const double cap_mb = std::stod(argv[3]);
  const int steps = std::stoi(argv[4]);
  const int64_t width = std::stoll(argv[5]);
  const int layers = std::stoi(argv[6]);

  auto env = environments::detect_environment(environments::Environ::from_process());
  if (!env->creates_processes_externally() && nproc > 1) {
    if (const auto placement = launchers::LocalLauncher(launchers::LaunchOptions().nproc_per_node(nproc)).launch()) {
      env = std::make_unique<environments::TorchElasticEnvironment>(*placement);
    }
  }
  torch::set_num_threads(1);
  auto group = distributed::ProcessGroup::init(env->process_group_options().timeout(std::chrono::seconds(20)));
  const double floor_mb = status_mb("VmSize");
  if (cap_mb > 0) {
    const auto bytes = static_cast<rlim_t>((floor_mb + cap_mb) * 1024 * 1024);
    const rlimit limit{bytes, bytes};
    if (::setrlimit(RLIMIT_AS, &limit) != 0) throw std::runtime_error("setrlimit(RLIMIT_AS) failed");
  }

  torch::manual_seed(0);
  auto net = std::make_shared<NetImpl>(width, layers);
  std::unique_ptr<distributed::DistributedDataParallel<NetImpl>> ddp;
  std::unique_ptr<distributed::FullyShardedDataParallel<NetImpl>> fsdp;
  if (sharding == "DDP") {
    // Copied gradients, as when memory_cap_test's cap was set (2026-12-02): with bucket views
    // (the default since 2026-12-06) one rank was once seen still short of its failing allocation
    // when the others' 20 s allreduce timeout ended the job, on 2 busy cores.
    ddp = std::make_unique<distributed::DistributedDataParallel<NetImpl>>(
        net, *group, distributed::DDPOptions().gradient_as_bucket_view(false));
  } else {
    const auto options = distributed::ShardingOptions()
                             .sharding_strategy(distributed::parse_sharding_strategy(sharding))
                             .auto_wrap_min_params(std::min<int64_t>(784, width) * width);
    core::tune_heap_for_sharded_training();  // as FSDPStrategy does
    fsdp = std::make_unique<distributed::FullyShardedDataParallel<NetImpl>>(net, *group, options);
  }
  torch::optim::Adam optimizer(net->parameters(), torch::optim::AdamOptions(1e-3));
  auto generator = at::make_generator<at::CPUGeneratorImpl>(1000 + group->rank());
  const auto x = torch::randn({64, 784}, generator);
  const auto y = torch::randint(10, {64}, generator, torch::kInt64);
  double loss_value = 0;
  for (int step = 0; step < steps; ++step) {
    optimizer.zero_grad();
    auto loss = torch::nn::functional::cross_entropy(ddp ? ddp->forward(x) : fsdp->forward(x), y);
    loss.backward();
    optimizer.step();
    loss_value = loss.item<double>();
  }
  distributed::barrier(*group, "trained");
  std::ostringstream line;
  line << "rank " << group->rank() << ": address space +" << static_cast<int64_t>(status_mb("VmPeak") - floor_mb)
       << " MB over its floor, peak RSS " << static_cast<int64_t>(status_mb("VmHWM")) << " MB\n";
  std::cout << line.str() << std::flush;
  distributed::barrier(*group, "reported");
  if (group->rank() == 0) std::cout << "trained " << steps << " steps, loss " << loss_value << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return lockstep::cli::guarded_main("sharded_memory_cap", [&] { return run(argc, argv); });
}
