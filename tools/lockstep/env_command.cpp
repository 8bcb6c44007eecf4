// `lockstep env [--json] [trainer flags]`: what this process would run as.
#include <iostream>

#include <nlohmann/json.hpp>

#include <lockstep/accelerators/device_parser.h>
#include <lockstep/cli/trainer_flags.h>
#include <lockstep/core/blas.h>
#include <lockstep/distributed/network_route.h>
#include <lockstep/environments/cluster_environment.h>
#include <lockstep/plan/connector.h>

#include "commands.h"

namespace lockstep {
namespace tool {
namespace {

// The interface Gloo would bind to here, or why there is none.
std::string gloo_interface_of(const std::string& main_address) {
  try {
    return distributed::gloo_interface(main_address).describe();
  } catch (const distributed::DistributedError& e) {
    return std::string("none: ") + e.what();
  }
}

struct EnvArgs {
  bool json = false;
  TrainerOptions flags;
};

// What the Trainer would run as here: the connector's own plan (environment, accelerator,
// devices per node, strategy), so that both always agree.
nlohmann::json describe(const EnvArgs& args) {
  const auto plan = resolve_plan(args.flags, environments::Environ::from_process(), nullptr,
                                 accelerators::cuda_device_count());
  const auto& env = *plan.context.environment;
  // The job: what this process joins under a scheduler, or what the Trainer will launch.
  const int job_size = env.creates_processes_externally() ? env.world_size() : plan.context.devices_per_node * plan.context.num_nodes;
  return {{"job_world_size", job_size},
          {"environment", env.name()},
          {"world_size", env.world_size()},
          {"global_rank", env.global_rank()},
          {"local_rank", env.local_rank()},
          {"node_rank", env.node_rank()},
          {"main_address", env.main_address()},
          {"main_port", env.main_port()},
          {"gloo_interface", gloo_interface_of(env.main_address())},
          {"creates_processes_externally", env.creates_processes_externally()},
          {"accelerator", accelerators::to_string(plan.context.accelerator)},
          {"devices", plan.context.devices_per_node},
          {"num_nodes", plan.context.num_nodes},
          {"strategy", plan.strategy->name()},
          {"blas", core::blas_library()}};
}

}  // namespace

Command add_env_command(CLI::App& app) {
  auto args = std::make_shared<EnvArgs>();
  auto* sub = app.add_subcommand("env", "Print the detected cluster environment, ranks and devices");
  sub->add_flag("--json", args->json, "one JSON object on one line");
  cli::add_trainer_flags(*sub, args->flags);
  return {sub, [args, sub] {
    core::warn_if_reference_blas();
    const auto info = describe(*args);
    if (args->json) {
      std::cout << info.dump() << std::endl;
      return 0;
    }
    // Labelled: the job as a whole, then this process (before a self-launch it is alone).
    const int job = info["job_world_size"], mine = info["world_size"];
    std::cout << "job: " << job << " process(es) = " << info["devices"].dump() << " per node x "
              << info["num_nodes"].dump() << " node(s); strategy " << info["strategy"].get<std::string>()
              << ", accelerator " << info["accelerator"].get<std::string>() << "\n";
    std::cout << "this process: global rank " << info["global_rank"].dump() << " of " << mine << ", local rank "
              << info["local_rank"].dump() << ", node " << info["node_rank"].dump();
    if (job > mine) std::cout << " (the Trainer starts the other " << job - mine << " process(es) in fit)";
    std::cout << "\n";
    for (const auto& [key, value] : info.items()) {
      std::cout << "  " << key << ": " << (value.is_string() ? value.get<std::string>() : value.dump()) << "\n";
    }
    return 0;
  }};
}

}  // namespace tool
}  // namespace lockstep
