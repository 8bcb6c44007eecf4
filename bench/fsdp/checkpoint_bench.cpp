// Saving and loading a sharded checkpoint (bench/run's section 11), the C++ side of
// bench/fsdp/checkpoint_bench.py (PyTorch's dcp.save and dcp.load of FSDP2): bench_fsdp's MLP
// trained for a few Adam steps by FSDPStrategy (FULL_SHARD, every Linear of at least
// --auto-wrap-min-params parameters a unit), then saved as the Trainer saves it (state_dict_type
// sharded or dcp) and loaded back as a resume does.
//   bench_checkpoint --model 100m --format dcp --nproc-per-node 2 --dir /tmp/ckpt
// Prints one JSON line on rank 0: the save's and the load's seconds (from a barrier before to a
// barrier after, the state dicts' making included), every rank's peak RSS after training, after
// the save and after the load, the checkpoint's bytes on disk, the largest unit's bytes, and
// whether the load gave back every parameter and Adam's state exactly (the run zeroes them first).
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <lockstep/checkpoint/checkpoint_io.h>
#include <lockstep/cli/guarded_main.h>
#include <lockstep/core/heap.h>
#include <lockstep/core/libtorch_compat.h>
#include <lockstep/plan/connector.h>
#include <lockstep/strategies/fsdp_strategy.h>

#include "mlp.h"

namespace {

using namespace lockstep;
namespace fs = std::filesystem;

// Each parameter's and each Adam moment's sum and norm: equal before the save and after the load
// exactly when the load gave the same values back (the run zeroes them in between).
std::vector<double> fingerprint(const std::vector<torch::Tensor>& parameters, torch::optim::Adam& optimizer) {
  std::vector<double> out;
  const auto add = [&](const torch::Tensor& t) {
    out.push_back(t.sum().item<double>());
    out.push_back(t.norm().item<double>());
  };
  for (const auto& p : parameters) {
    add(p);
    const auto found = optimizer.state().find(libtorch::optimizer_state_key<torch::optim::Optimizer>(p));
    if (found == optimizer.state().end()) continue;
    const auto& adam = static_cast<torch::optim::AdamParamState&>(*found->second);
    add(adam.exp_avg());
    add(adam.exp_avg_sq());
  }
  return out;
}

void zero(const std::vector<torch::Tensor>& parameters, torch::optim::Adam& optimizer) {
  torch::NoGradGuard no_grad;
  for (const auto& p : parameters) p.zero_();
  for (auto& [key, state] : optimizer.state()) {
    auto& adam = static_cast<torch::optim::AdamParamState&>(*state);
    adam.exp_avg().zero_();
    adam.exp_avg_sq().zero_();
  }
}

int64_t bytes_under(const std::string& dir) {
  int64_t total = 0;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file()) total += static_cast<int64_t>(entry.file_size());
  }
  return total;
}

// What the Trainer's checkpoint of `net` and `optimizer` holds, saved by the strategy at `dir`.
void save(strategies::FSDPStrategy& strategy, bench::NetImpl& net,
          const std::shared_ptr<torch::optim::Adam>& optimizer, const std::string& dir) {
  auto state = checkpoint::make_checkpoint();
  state.insert("state_dict", strategy.module_state_dict(net));
  c10::impl::GenericList optimizers(c10::AnyType::get());
  optimizers.push_back(strategy.optimizer_state_dict(*optimizer));
  state.insert("optimizer_states", optimizers);
  state.insert("global_step", int64_t{1});
  strategy.save_checkpoint(state, dir, checkpoint::CheckpointIO(), {optimizer});
}

void load(strategies::FSDPStrategy& strategy, bench::NetImpl& net,
          const std::shared_ptr<torch::optim::Adam>& optimizer, const std::string& dir) {
  const auto loaded = strategy.load_checkpoint(dir, checkpoint::CheckpointIO(), {optimizer});
  strategy.load_module_state_dict(net, loaded.at("state_dict").toGenericDict(), /*strict=*/true);
  strategy.load_optimizer_state_dict(*optimizer, loaded.at("optimizer_states").toListRef()[0].toGenericDict());
}

struct Args {
  std::string model = "100m", format = "dcp", dir;
  int nproc = 2, steps = 2;
  int64_t batch = 64, min_params = 1'000'000;
};

int run(const Args& a) {
  auto strategy = std::make_shared<strategies::FSDPStrategy>(
      distributed::ShardingOptions().auto_wrap_min_params(a.min_params), strategies::parse_state_dict_type(a.format));
  const auto options = PlanOptions().accelerator("cpu").devices(std::to_string(a.nproc)).timeout(600);
  auto plan = launch(resolve_plan(options, environments::Environ::from_process(), strategy));
  auto& group = strategy->process_group();
  torch::set_num_threads(1);
  core::tune_heap_for_sharded_training();

  torch::manual_seed(0);
  auto net = std::make_shared<bench::NetImpl>(a.model);
  int64_t parameters = 0, largest_unit = 0;
  for (const auto& p : net->parameters()) parameters += p.numel();
  for (const auto& layer : net->layers->children()) {
    int64_t n = 0;
    for (const auto& p : layer->parameters()) n += p.numel();
    largest_unit = std::max(largest_unit, n);
  }
  auto wrapped = strategy->setup_module(net);
  const auto pieces = net->parameters();
  auto optimizer = std::make_shared<torch::optim::Adam>(pieces, torch::optim::AdamOptions(1e-3));
  auto generator = at::make_generator<at::CPUGeneratorImpl>(1000 + group.rank());
  for (int i = 0; i < a.steps; ++i) {
    optimizer->zero_grad();
    wrapped->before_forward();
    const auto x = torch::randn({a.batch, 784}, generator);
    const auto y = torch::randint(10, {a.batch}, generator, torch::kInt64);
    torch::nn::functional::cross_entropy(net->forward(x), y).backward();
    optimizer->step();
  }
  optimizer->zero_grad();
  const auto trained = fingerprint(pieces, *optimizer);
  const double peak_train = bench::status_mb("VmHWM");

  const auto timed = [&](const char* name, const std::function<void()>& body) {
    strategy->barrier(std::string(name) + " start");
    const auto start = std::chrono::steady_clock::now();
    body();
    strategy->barrier(std::string(name) + " end");
    return bench::seconds_since(start);
  };
  const double save_s = timed("save", [&] { save(*strategy, *net, optimizer, a.dir); });
  const double peak_save = bench::status_mb("VmHWM");
  zero(pieces, *optimizer);
  const double load_s = timed("load", [&] { load(*strategy, *net, optimizer, a.dir); });
  const double peak_load = bench::status_mb("VmHWM");
  const bool restored = fingerprint(pieces, *optimizer) == trained;

  const auto restored_all = bench::per_rank(group, restored ? 1 : 0);
  const auto train_mb = bench::per_rank(group, peak_train);
  const auto save_mb = bench::per_rank(group, peak_save);
  const auto load_mb = bench::per_rank(group, peak_load);
  if (group.rank() == 0) {
    nlohmann::json out{{"impl", "lockstep"},         {"format", a.format},
                       {"model", a.model},           {"parameters", parameters},
                       {"world_size", group.world_size()},
                       {"save_s", save_s},           {"load_s", load_s},
                       {"peak_rss_mb_train", train_mb}, {"peak_rss_mb_save", save_mb},
                       {"peak_rss_mb_load", load_mb},   {"checkpoint_bytes", bytes_under(a.dir)},
                       {"largest_unit_bytes", largest_unit * 4},
                       {"restored", std::count(restored_all.begin(), restored_all.end(), 1.0) == group.world_size()}};
    std::cout << out.dump() << std::endl;
  }
  strategy->teardown();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return lockstep::cli::guarded_main("bench_checkpoint", [&] {
    CLI::App app{"Lockstep sharded checkpoint save and load", "bench_checkpoint"};
    Args a;
    app.add_option("--model", a.model)->check(CLI::IsMember({"25m", "100m", "100m-wide"}));
    app.add_option("--format", a.format, "sharded (Lockstep's) or dcp (torch.distributed.checkpoint's)")
        ->check(CLI::IsMember({"sharded", "dcp"}));
    app.add_option("--dir", a.dir, "where the checkpoint goes (replaced if there)")->required();
    app.add_option("--nproc-per-node", a.nproc)->check(CLI::Range(1, 1024));
    app.add_option("--steps", a.steps, "Adam steps before the save, at least 1")->check(CLI::Range(1, 1 << 20));
    app.add_option("--batch", a.batch, "examples per rank per step")->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
    app.add_option("--auto-wrap-min-params", a.min_params, "a Linear with at least this many parameters is a unit")
        ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
    CLI11_PARSE(app, argc, argv);
    return run(a);
  });
}
