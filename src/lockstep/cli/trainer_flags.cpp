#include <lockstep/cli/trainer_flags.h>

#include <iostream>

namespace lockstep {
namespace cli {

void add_trainer_flags(CLI::App& app, TrainerFlags& flags) {
  app.add_option("--accelerator", flags.accelerator, "auto|cpu|cuda|gpu")
      ->envname("LOCKSTEP_TRAINER_ACCELERATOR")->capture_default_str();
  app.add_option("--devices", flags.devices, "auto, a count N, -1 (all GPUs), or GPU ids \"0,2\"")
      ->envname("LOCKSTEP_TRAINER_DEVICES")->capture_default_str();
  app.add_option("--strategy", flags.strategy, "auto|single_device|ddp|ddp_fork|ddp_find_unused_parameters_true|...")
      ->envname("LOCKSTEP_TRAINER_STRATEGY")->capture_default_str();
  app.add_option("--num-nodes", flags.num_nodes, "number of nodes")
      ->envname("LOCKSTEP_TRAINER_NUM_NODES")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--process-group-backend", flags.process_group_backend, "gloo|nccl|mpi (default: gloo on cpu)")
      ->envname("LOCKSTEP_TRAINER_PROCESS_GROUP_BACKEND");
  app.add_option("--timeout", flags.timeout, "seconds a collective may block before it fails")
      ->envname("LOCKSTEP_TRAINER_TIMEOUT")->check(CLI::PositiveNumber)->capture_default_str();
}

int parse_or_exit_code(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
    return -1;
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return 0;
  } catch (const CLI::CallForAllHelp&) {
    std::cout << app.help("", CLI::AppFormatMode::All);
    return 0;
  } catch (const CLI::ParseError& e) {
    std::cerr << app.get_name() << ": error: " << e.what() << "\n"
              << app.get_name() << ": run '" << app.get_name() << " --help' for the flags and their values.\n";
    return 2;
  }
}

}  // namespace cli
}  // namespace lockstep
