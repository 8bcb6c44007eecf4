// What LOCKSTEP_DISTRIBUTED_DEBUG=detail costs: microseconds per small all_reduce (one float, as a
// logged metric's sync) and per barrier, with the cross-rank check of each call off and on.
//   bench_collective_check --nproc-per-node 2 --calls 2000 [--check]
// Prints one JSON line on rank 0. bench/run runs it both ways.
#include <chrono>
#include <functional>
#include <iostream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <lockstep/cli/guarded_main.h>
#include <lockstep/distributed/collectives.h>
#include <lockstep/environments/cluster_environment.h>
#include <lockstep/environments/torchelastic_environment.h>
#include <lockstep/launchers/local_launcher.h>

namespace {

using namespace lockstep;

int run(int argc, char** argv) {
  CLI::App app{"Cost of checking every collective across ranks", "bench_collective_check"};
  int nproc = 2, calls = 2000;
  bool check = false;
  app.add_option("--nproc-per-node", nproc)->check(CLI::Range(2, 64));
  app.add_option("--calls", calls)->check(CLI::Range(1, 1 << 24));
  app.add_flag("--check", check, "compare every call across ranks (LOCKSTEP_DISTRIBUTED_DEBUG=detail)");
  CLI11_PARSE(app, argc, argv);

  auto env = environments::detect_environment(environments::Environ::from_process());
  if (!env->creates_processes_externally()) {
    const auto options = launchers::LaunchOptions().nproc_per_node(nproc).master_port(env->main_port());
    if (const auto placement = launchers::LocalLauncher(options).launch()) {
      env = std::make_unique<environments::TorchElasticEnvironment>(*placement);
    }
  }
  torch::set_num_threads(1);
  auto group = distributed::ProcessGroup::init(
      env->process_group_options().timeout(std::chrono::seconds(60)).check_collectives(check));
  const auto time_per_call = [&](const std::function<void()>& call) {
    for (int i = 0; i < 20; ++i) call();
    distributed::barrier(*group, "start");
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) call();
    const auto seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return distributed::all_reduce(*group, torch::tensor({seconds / calls * 1e6}, torch::kFloat64),
                                   distributed::ReduceOp::max)
        .item<double>();
  };
  auto metric = torch::ones({1});
  const double all_reduce_us = time_per_call([&] { distributed::all_reduce(*group, metric, distributed::ReduceOp::sum); });
  const double barrier_us = time_per_call([&] { distributed::barrier(*group, "step"); });
  if (group->rank() == 0) {
    std::cout << nlohmann::json{{"impl", "lockstep"},
                                {"check_collectives", group->checks_collectives()},
                                {"world_size", group->world_size()},
                                {"store", env->store_file().empty() ? "tcp" : "file"},
                                {"calls", calls},
                                {"all_reduce_us", all_reduce_us},
                                {"barrier_us", barrier_us}}
                     .dump()
              << std::endl;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return lockstep::cli::guarded_main("bench_collective_check", [&] { return run(argc, argv); });
}
