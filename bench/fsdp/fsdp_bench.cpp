// Sharded training memory and speed of Lockstep, the C++ side of bench/fsdp/fsdp_bench.py (PyTorch
// FSDP2 and ZeroRedundancyOptimizer): an MLP built as a torch::nn::Sequential, so that every large
// Linear can be a unit of its own, Adam, synthetic batches, gloo on the CPU.
//   bench_fsdp --model 25m|100m|100m-wide --sharding FULL_SHARD --nproc-per-node 2 --steps 10 --warmup 2
// --sharding DDP is Lockstep's DistributedDataParallel; the others are FullyShardedDataParallel's
// strategies, with every Linear of at least --auto-wrap-min-params parameters a unit.
// Prints one JSON line on rank 0: steps/s over the timed steps, the final loss (mean over the
// ranks), every rank's peak RSS, its floor (the RSS once LibTorch and the process group are up,
// before the model is built) and its shared-memory RSS at the end, the all-gathers' time per step,
// how long the training thread waited for them and the share hidden behind compute (the engine's
// comm_times()). bench/run runs it beside the Python side and compares.
#include <sys/resource.h>

#include <chrono>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <lockstep/cli/guarded_main.h>
#include <lockstep/core/error.h>
#include <lockstep/core/heap.h>
#include <lockstep/distributed/collectives.h>
#include <lockstep/distributed/ddp/ddp.h>
#include <lockstep/distributed/fsdp/fully_sharded.h>
#include <lockstep/environments/cluster_environment.h>
#include <lockstep/environments/torchelastic_environment.h>
#include <lockstep/launchers/local_launcher.h>

#include "mlp.h"

namespace {

using namespace lockstep;
using Clock = std::chrono::steady_clock;

using bench::NetImpl;
using bench::per_rank;
using bench::seconds_since;
using bench::status_mb;
using bench::unix_seconds;

int run(int argc, char** argv) {
  CLI::App app{"Lockstep sharded training memory and speed", "bench_fsdp"};
  std::string model = "25m", sharding = "FULL_SHARD", start_method = "popen";
  int nproc = 2, steps = 10, warmup = 2;
  int64_t batch = 64, min_params = 1'000'000;
  app.add_option("--model", model)->check(CLI::IsMember({"25m", "100m", "100m-wide"}));
  app.add_option("--sharding", sharding, "DDP, NO_SHARD, SHARD_OPTIMIZER_STATE, SHARD_GRAD_OP or FULL_SHARD");
  app.add_option("--nproc-per-node", nproc)->check(CLI::Range(1, 1024));
  app.add_option("--steps", steps)->check(CLI::Range(1, 1 << 30));
  app.add_option("--warmup", warmup, "untimed steps first, at least 1 (the first is the start-up's end)")
      ->check(CLI::Range(1, 1 << 30));
  app.add_option("--batch", batch, "examples per rank per step")->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--auto-wrap-min-params", min_params, "a Linear with at least this many parameters is a unit")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  bool bf16 = false;
  app.add_flag("--bf16", bf16, "FullyShardedDataParallel's param_dtype and reduce_dtype bfloat16");
  app.add_option("--start-method", start_method, "popen: re-execute for the other ranks; fork: fork them")
      ->check(CLI::IsMember({"popen", "fork"}));
  CLI11_PARSE(app, argc, argv);
  const bool ddp_side = sharding == "DDP" || sharding == "ddp";
  const auto strategy = ddp_side ? distributed::ShardingStrategy::no_shard : distributed::parse_sharding_strategy(sharding);
  const std::string sharding_name = ddp_side ? "DDP" : distributed::to_string(strategy);
  if (bf16 && ddp_side) {
    std::cerr << "bench_fsdp: --bf16 is FullyShardedDataParallel's mixed precision; --sharding DDP has none. Give "
                 "another --sharding, or drop --bf16.\n";
    return 2;
  }

  auto env = environments::detect_environment(environments::Environ::from_process());
  if (!env->creates_processes_externally() && nproc > 1) {
    const auto options = launchers::LaunchOptions().nproc_per_node(nproc).master_port(env->main_port());
    const auto method = start_method == "fork" ? launchers::StartMethod::fork : launchers::StartMethod::reexec;
    if (const auto placement = launchers::LocalLauncher(options, method).launch()) {
      env = std::make_unique<environments::TorchElasticEnvironment>(*placement);
    }
  }
  torch::set_num_threads(1);
  auto group = distributed::ProcessGroup::init(env->process_group_options().timeout(std::chrono::seconds(300)));
  const double floor_mb = status_mb("VmRSS");

  torch::manual_seed(0);
  auto net = std::make_shared<NetImpl>(model);
  int64_t parameters = 0;
  for (const auto& p : net->parameters()) parameters += p.numel();
  std::unique_ptr<distributed::DistributedDataParallel<NetImpl>> ddp;
  std::unique_ptr<distributed::FullyShardedDataParallel<NetImpl>> fsdp;
  std::vector<torch::Tensor> trained;
  if (ddp_side) {
    ddp = std::make_unique<distributed::DistributedDataParallel<NetImpl>>(
        net, *group, distributed::DDPOptions().gradient_as_bucket_view(true));
    trained = net->parameters();
  } else {
    core::tune_heap_for_sharded_training();  // as FSDPStrategy does
    fsdp = std::make_unique<distributed::FullyShardedDataParallel<NetImpl>>(
        net, *group,
        distributed::ShardingOptions()
            .sharding_strategy(strategy)
            .auto_wrap_min_params(min_params)
            .param_dtype(bf16 ? std::optional<at::ScalarType>(at::kBFloat16) : std::nullopt)
            .reduce_dtype(bf16 ? std::optional<at::ScalarType>(at::kBFloat16) : std::nullopt));
    trained = fsdp->parameters();  // this rank's pieces
  }
  torch::optim::Adam optimizer(trained, torch::optim::AdamOptions(1e-3));
  // Each rank's batches: a fixed generator per rank, the same on the Python side.
  auto generator = at::make_generator<at::CPUGeneratorImpl>(1000 + group->rank());
  std::vector<torch::Tensor> xs, ys;
  for (int i = 0; i < 8; ++i) {
    xs.push_back(torch::randn({batch, 784}, generator));
    ys.push_back(torch::randint(10, {batch}, generator, torch::kInt64));
  }
  double loss_value = 0;
  auto step = [&](int i) {
    optimizer.zero_grad();
    auto out = ddp ? ddp->forward(xs[i % 8]) : fsdp->forward(xs[i % 8]);
    auto loss = torch::nn::functional::cross_entropy(out, ys[i % 8]);
    loss.backward();
    optimizer.step();
    loss_value = loss.item<double>();
  };
  step(0);
  const double first_step_unix = unix_seconds();
  for (int i = 1; i < warmup; ++i) step(i);
  distributed::barrier(*group, "timed_start");
  if (fsdp) fsdp->reset_comm_times();
  const auto start = Clock::now();
  for (int i = warmup; i < warmup + steps; ++i) step(i);
  distributed::barrier(*group, "timed_end");
  const double seconds = seconds_since(start);
  const auto comm = fsdp ? fsdp->comm_times() : distributed::FullyShardedDataParallelBase::CommTimes();

  auto loss = distributed::all_reduce(*group, torch::tensor({loss_value}, torch::kFloat64), distributed::ReduceOp::mean);
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);  // ru_maxrss: KiB on Linux
  const auto peak = per_rank(*group, static_cast<double>(usage.ru_maxrss) / 1024.0);
  const auto floors = per_rank(*group, floor_mb);
  const auto shmem = per_rank(*group, status_mb("RssShmem"));
  const auto gathers = per_rank(*group, comm.all_gather_s / steps);
  const auto waits = per_rank(*group, comm.all_gather_waited_s / steps);
  const auto hidden = per_rank(*group, comm.all_gather_hidden_share());
  const auto fresh = per_rank(*group, static_cast<double>(comm.all_gather_fresh_bytes) / (1 << 20) / steps);
  std::string transport = "none (one rank)";
  if (group->world_size() > 1) {
    const std::string why_not = ddp ? ddp->why_not_shared_memory() : fsdp->why_not_shared_memory();
    transport = why_not.empty() ? "shared memory" : "gloo: " + why_not;
  }
  if (group->rank() == 0) {
    nlohmann::json out{{"impl", "lockstep"},
                       {"sharding", sharding_name + (bf16 ? " bf16" : "")},
                       {"model", model},
                       {"parameters", parameters},
                       {"world_size", group->world_size()},
                       {"steps", steps},
                       {"batch", batch},
                       {"steps_per_s", steps / seconds},
                       {"loss", loss.item<double>()},
                       {"first_step_unix", first_step_unix},
                       {"transport", transport},
                       {"units", fsdp ? static_cast<int64_t>(fsdp->unit_count()) : 1},
                       {"floor_rss_mb", floors},
                       {"peak_rss_mb", peak},
                       {"shmem_rss_mb_at_end", shmem},
                       {"all_gather_s_per_step", gathers},
                       {"all_gather_wait_s_per_step", waits},
                       {"all_gather_fresh_mb_per_step", fresh}};
    // The share of all-gather time the training thread did not wait for (the engine's
    // comm_times(): gathers run on its communication thread, prefetched in forward and backward).
    if (fsdp && group->world_size() > 1 && strategy != distributed::ShardingStrategy::no_shard) {
      out["all_gather_hidden_share"] = hidden;
    }
    std::cout << out.dump() << std::endl;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return lockstep::cli::guarded_main("bench_fsdp", [&] { return run(argc, argv); }); }
