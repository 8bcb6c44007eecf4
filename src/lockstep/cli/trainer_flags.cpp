#include <lockstep/cli/trainer_flags.h>

#include <algorithm>
#include <cctype>
#include <iostream>

namespace lockstep {
namespace cli {
namespace {

// "--max-epochs" -> "LOCKSTEP_TRAINER_MAX_EPOCHS"
std::string variable_for(const std::string& flag) {
  std::string name = flag.substr(2);
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return c == '-' ? '_' : static_cast<char>(std::toupper(c)); });
  return "LOCKSTEP_TRAINER_" + name;
}

template <typename T>
CLI::Option* add(CLI::App& app, const std::string& flag, T& value, const std::string& help) {
  return app.add_option(flag, value, help)->envname(variable_for(flag))->capture_default_str();
}

}  // namespace

void add_trainer_flags(CLI::App& app, TrainerOptions& o) {
  auto* group = app.add_option_group("Trainer", "Trainer flags (each also LOCKSTEP_TRAINER_<FLAG>)");
  auto& g = *group;
  add(g, "--accelerator", o.accelerator(), "auto|cpu|cuda|gpu");
  add(g, "--devices", o.devices(), "auto, a count N, -1 (all GPUs), or GPU ids \"0,2\"");
  add(g, "--strategy", o.strategy(), "auto|single_device|ddp|ddp_fork|ddp_find_unused_parameters_true|...");
  add(g, "--auto-select-gpus", o.auto_select_gpus(), "true|false: with a device count on cuda, pick free GPUs");
  add(g, "--num-nodes", o.num_nodes(), "nodes in the job")->check(CLI::Range(1, 1 << 20));
  add(g, "--precision", o.precision(), "32-true|64-true|bf16-mixed|16-mixed");
  add(g, "--max-epochs", o.max_epochs(), "stop after this many epochs (-1: 1000 unless --max-steps)")
      ->check(CLI::Range(int64_t{-1}, int64_t{1} << 40));
  add(g, "--max-steps", o.max_steps(), "stop after this many optimizer steps (-1: no limit)")
      ->check(CLI::Range(int64_t{-1}, int64_t{1} << 50));
  add(g, "--accumulate-grad-batches", o.accumulate_grad_batches(), "batches per optimizer step")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  add(g, "--gradient-clip-val", o.gradient_clip_val(), "clip gradients to this norm or value (0: off)")
      ->check(CLI::Range(0.0, 1e12));
  add(g, "--gradient-clip-algorithm", o.gradient_clip_algorithm(), "norm|value")->check(CLI::IsMember({"norm", "value"}));
  add(g, "--seed", o.seed(), "seed for every random generator (-1: unseeded)")
      ->check(CLI::Range(int64_t{-1}, std::numeric_limits<int64_t>::max()));
  add(g, "--deterministic", o.deterministic(), "true|false: deterministic algorithms only");
  add(g, "--default-root-dir", o.default_root_dir(), "where logs and checkpoints go");
  add(g, "--ckpt-path", o.ckpt_path(), "checkpoint to resume from, or 'last'");
  add(g, "--sync-batchnorm", o.sync_batchnorm(), "true|false: SyncBatchNorm under DDP");
  add(g, "--limit-train-batches", o.limit_train_batches(), "fraction (0.25) or count (10) of training batches");
  add(g, "--limit-val-batches", o.limit_val_batches(), "fraction or count of validation batches");
  add(g, "--limit-test-batches", o.limit_test_batches(), "fraction or count of test batches");
  add(g, "--val-check-interval", o.val_check_interval(),
      "validate every fraction (0.25) of the epoch or every N (100) training batches");
  add(g, "--check-val-every-n-epoch", o.check_val_every_n_epoch(), "validate every N epochs")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  add(g, "--num-sanity-val-steps", o.num_sanity_val_steps(), "validation batches before training")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  add(g, "--log-every-n-steps", o.log_every_n_steps(), "write metrics every N steps")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  add(g, "--enable-progress-bar", o.enable_progress_bar(), "true|false");
  add(g, "--enable-checkpointing", o.enable_checkpointing(), "true|false");
  add(g, "--use-distributed-sampler", o.use_distributed_sampler(), "true|false");
  add(g, "--process-group-backend", o.process_group_backend(), "gloo|nccl|mpi (default: gloo on cpu)");
  add(g, "--timeout", o.timeout(), "seconds a collective may block before it fails")
      ->check(CLI::Range(0.001, 1e9));
  add(g, "--benchmark", o.benchmark(), "true|false: cudnn.benchmark (CUDA only)");
  add(g, "--profiler", o.profiler(), "true|false: print time per hook at the end");
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
