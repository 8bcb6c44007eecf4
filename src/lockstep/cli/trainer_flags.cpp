#include <lockstep/cli/trainer_flags.h>

#include <algorithm>
#include <cctype>
#include <functional>
#include <iostream>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include <torch/version.h>

#include <lockstep/core/error.h>
#include <lockstep/core/program_config.h>
#include <lockstep/core/seed.h>
#include <lockstep/distributed/process_group.h>

#include "fsdp_flags.h"
#include "yaml_config.h"

extern char** environ;

namespace lockstep {
namespace cli {

std::string detail::variable_for(const std::string& flag) {
  std::string name = flag.substr(2);
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return c == '-' ? '_' : static_cast<char>(std::toupper(c)); });
  return "LOCKSTEP_TRAINER_" + name;
}

namespace {

using detail::nearest;
using detail::variable_for;

// The value as --help and --print-config show it: CLI11 streams a bool as 1 and a double to six
// digits, which --config would not read back as the same number.
template <typename T>
std::function<std::string()> shown(const T& value) {
  if constexpr (std::is_same_v<T, bool>) {
    return [&value] { return std::string(value ? "true" : "false"); };
  } else if constexpr (std::is_floating_point_v<T>) {
    return [&value] { return nlohmann::json(value).dump(); };  // the shortest text that reads back the same
  } else {
    return {};
  }
}

template <typename T>
CLI::Option* add(CLI::App& app, const std::string& flag, T& value, const std::string& help) {
  auto* option = app.add_option(flag, value, help)->envname(variable_for(flag));
  if (auto text = shown(value)) option->default_function(text);
  return option->capture_default_str();
}

using RetiredFlag = std::pair<const char*, const char*>;  // flag, what replaced it

// Refused, as flag or as variable, with what replaced them; hidden from --help.
void add_retired(CLI::App& app, const std::vector<RetiredFlag>& retired) {
  for (const auto& [flag, why] : retired) {
    const std::string name = flag, reason = why;
    app.add_option_function<std::string>(name, [name, reason](const std::string&) {
         throw CLI::ValidationError(name, reason);
       })
        ->envname(variable_for(name))
        ->group("");
  }
}

// Flags of the devices and precision that Lightning dropped and users still type.
const std::vector<RetiredFlag> retired_plan_flags = {
    {"--gpus", "Lightning 1.7 replaced it: use --accelerator cuda --devices N"},
    {"--tpu-cores", "TPUs need torch_xla, which has no C++ frontend: use --accelerator cpu or cuda with --devices N"},
    {"--ipus", "IPUs need poptorch, which has no C++ frontend: use --accelerator cpu or cuda with --devices N"},
    {"--num-processes", "Lightning 1.7 replaced it: use --accelerator cpu --devices N --strategy ddp"},
    {"--distributed-backend", "Lightning 1.5 replaced it: use --strategy ddp"},
    {"--amp-backend", "Lightning 2.0 removed it: use --precision bf16-mixed or 16-mixed (LibTorch's autocast)"},
    {"--amp-level", "Lightning 2.0 removed it: use --precision bf16-mixed or 16-mixed (LibTorch's autocast)"},
};

// The Trainer's other dropped flags (Fabric never had them: there they are unknown flags).
const std::vector<RetiredFlag> retired_trainer_flags = {
    {"--replace-sampler-ddp", "Lightning 2.0 renamed it: use --use-distributed-sampler true|false"},
    {"--resume-from-checkpoint", "Lightning 2.0 replaced it: use --ckpt-path PATH (or --ckpt-path last)"},
    {"--checkpoint-callback", "Lightning 1.7 replaced it: use --enable-checkpointing true|false"},
    {"--weights-save-path", "Lightning 1.8 removed it: use --default-root-dir DIR (checkpoints go to "
                            "DIR/lockstep_logs/version_N/checkpoints)"},
    {"--log-gpu-memory", "Lightning 1.7 removed it (its DeviceStatsMonitor callback replaced it) and Lockstep "
                         "logs no device memory: remove the flag and watch nvidia-smi"},
    {"--progress-bar-refresh-rate", "Lightning 1.7 removed it: use --enable-progress-bar true|false (a "
                                    "ProgressBar callback with ProgressBarOptions sets how often it prints)"},
    {"--flush-logs-every-n-steps", "Lightning 1.7 removed it: remove the flag; the CSV logger writes each row "
                                   "as it is logged, every --log-every-n-steps steps"},
    {"--terminate-on-nan", "Lightning 1.7 removed it: remove the flag; a loss that is nan or inf stops every "
                           "rank anyway, and --detect-anomaly true names the operation that made it"},
    {"--weights-summary", "Lightning 1.7 replaced it: use --enable-model-summary true|false"},
    {"--track-grad-norm", "Lightning 2.0 removed it: remove the flag and log the norm from a callback's "
                          "on_before_optimizer_step"},
    {"--auto-lr-find", "Lightning 2.0 moved it to the Tuner: use --lr-find (the LR finder before fit trains), "
                       "or lockstep::Tuner(trainer).lr_find(model, train) in code"},
    {"--auto-scale-batch-size", "Lightning 2.0 moved it to the Tuner: use --scale-batch-size power|binsearch, "
                                "or lockstep::Tuner(trainer).scale_batch_size(model, train) in code"},
};

// Lightning 2.6 Trainer arguments that Lockstep has no flag for, with what to do instead (the
// user guide's table of Lightning's Trainer arguments lists every argument; a test checks both).
const std::vector<RetiredFlag> lightning_only_flags = {
    {"--logger", "Lockstep's loggers are C++ objects, not a flag: the Trainer writes CSV logs under "
                 "--default-root-dir, and trainer.add_logger(...) in code replaces them (TensorBoardLogger, your own)"},
    {"--callbacks", "callbacks are C++ objects, not a flag: add them in code with trainer.add_callback(...) "
                    "(EarlyStopping, ModelCheckpoint, LearningRateMonitor, your own)"},
    {"--min-epochs", "Lockstep has no minimum number of epochs: remove the flag, and give EarlyStopping a longer "
                     "patience (EarlyStoppingOptions().patience(N)) so that it cannot stop sooner"},
    {"--min-steps", "Lockstep has no minimum number of steps: remove the flag, and give EarlyStopping a longer "
                    "patience (EarlyStoppingOptions().patience(N)) so that it cannot stop sooner"},
    {"--max-time", "Lockstep has no time limit: use --max-steps N or --max-epochs N, or a Callback that calls "
                   "trainer.request_stop() when the time is up (fit ends after that epoch)"},
    {"--limit-predict-batches", "Lockstep has no limit for predict: give predict a DataLoader over only the "
                                "examples to predict (--fast-dev-run N limits every loop, predict's too)"},
    {"--barebones", "Lockstep has no barebones switch: use --enable-checkpointing false --enable-progress-bar "
                    "false --enable-model-summary false (the CSV logger and the metrics stay)"},
    {"--plugins", "Lightning's plugins are Python objects: use --precision for a precision plugin, and in code "
                  "trainer.set_cluster_environment(...) or trainer.set_checkpoint_io(...) for the others"},
    {"--reload-dataloaders-every-n-epochs", "the Trainer takes its loaders once per fit: remove the flag; a "
                                            "DataLoader reshuffles every epoch, and a Callback's "
                                            "on_train_epoch_start may change what your Dataset returns"},
    {"--enable-autolog-hparams", "Lockstep always gives the loggers the module's hparams() when fit starts "
                                 "(Lightning's default, true): remove the flag; a module whose hparams() is "
                                 "empty logs none"},
    {"--model-registry", "Lightning's model registry uploads to Lightning AI's cloud, which Lockstep does not "
                         "reach: remove the flag and copy the run's checkpoints folder where you keep models"},
};

// --deterministic takes true or false; Lightning's "warn" (warn_only) has no LibTorch 1.13 C++ switch.
std::string refuse_deterministic_warn(const std::string& value) {
  if (value != "warn") return "";
  return "warn (Lightning's warn_only mode) is not available: use --deterministic true, which stops at an operation "
         "that has no deterministic kernel and names it, or false";
}

// Lightning's profiler="simple" and "pytorch"; true is simple, false none. Its other profilers
// are Python's.
std::string read_profiler(std::string& value) {
  if (value == "true") value = "simple";
  if (value == "false") value = "";
  if (value.empty() || value == "simple" || value == "pytorch") return "";
  if (value == "advanced" || value == "xla") {
    return value + " is Lightning's Python profiler: use --profiler simple (the time per hook and loop phase), "
                   "--profiler pytorch (a trace per rank from LibTorch's profiler), or a Profiler of your own in "
                   "code (trainer.set_profiler(...))";
  }
  return value + " is not a profiler: use simple (or true), pytorch, or false";
}

// Edit distance between two words (insertions, deletions, substitutions).
size_t distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t substituted = diagonal + (a[i - 1] == b[j - 1] ? 0 : 1);
      diagonal = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, substituted});
    }
  }
  return row[b.size()];
}

// Every option of `app` and its option groups: its long names ("--max-epochs") and variables.
void collect_names(const CLI::App& app, std::vector<std::string>* flags, std::vector<std::string>* variables) {
  for (const CLI::Option* option : app.get_options()) {
    for (const auto& name : option->get_lnames()) flags->push_back("--" + name);
    if (!option->get_envname().empty()) variables->push_back(option->get_envname());
  }
  for (const CLI::App* group : app.get_subcommands([](const CLI::App* sub) { return sub->get_name().empty(); })) {
    collect_names(*group, flags, variables);
  }
}

std::string short_name(const std::string& name) { return name.substr(name.find_last_of('/') + 1); }

// A LOCKSTEP_TRAINER_* variable that no flag reads would be ignored without a word.
void warn_about_unknown_variables(const std::string& program, const std::vector<std::string>& variables) {
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string text = *entry;
    const std::string name = text.substr(0, text.find('='));
    if (name.rfind("LOCKSTEP_TRAINER_", 0) != 0) continue;
    if (std::find(variables.begin(), variables.end(), name) != variables.end()) continue;
    const std::string near = nearest(name, variables);
    std::cerr << program << ": warning: " << name << " matches no flag and is ignored"
              << (near.empty() ? "" : "; did you mean " + near + "?") << "\n";
  }
}

// Seeded as soon as the flag is read, so that a model built before fit() starts from the same
// weights every run (LightningCLI seeds before it instantiates anything).
void add_seed_flag(CLI::App& app, int64_t& stored) {
  app.add_option_function<int64_t>(
         "--seed",
         [&stored](const int64_t& seed) {
           stored = seed;
           if (seed >= 0) seed_everything(static_cast<uint64_t>(seed));
         },
         "seed for every random generator, applied when the flags are read (-1: unseeded)")
      ->envname(variable_for("--seed"))
      ->default_str(std::to_string(stored))
      ->check(CLI::Range(int64_t{-1}, std::numeric_limits<int64_t>::max()));
}

// A count-or-fraction flag, parsed as it is read: a bad value is exit 2 before anything starts.
CLI::Option* add_limit(CLI::App& app, const std::string& flag, BatchLimit& value, const std::string& help) {
  return app
      .add_option_function<std::string>(
          flag,
          [&value, flag](const std::string& text) {
            try {
              value = BatchLimit::parse(text, flag);
            } catch (const UsageError& e) {
              throw CLI::ValidationError(e.what());
            }
          },
          help)
      ->envname(variable_for(flag))
      ->default_str(value.str());
}

// The backends this build can create, as the connector takes them.
std::string backend_help() {
  std::string names;
  for (const auto& name : distributed::available_backends()) names += (names.empty() ? "" : "|") + name;
  return names + " (what this build can create; no mpi); default gloo on cpu, nccl on cuda";
}

// The flags of where and how the processes run, without the strategies' own.
void add_plan_flags_of(CLI::App& app, PlanOptions& o) {
  o.trainer_variables(false);  // the flags read the variables: the Trainer must not read them again
  add(app, "--accelerator", o.accelerator(), "auto|cpu|cuda|gpu");
  add(app, "--devices", o.devices(), "auto, a count N, -1 (all GPUs), or GPU ids \"0,2\"");
  add(app, "--strategy", o.strategy(), "auto|single_device|ddp|ddp_fork|ddp_separate|ddp_find_unused_parameters_true|fsdp|fsdp_hybrid_shard|...");
  add(app, "--auto-select-gpus", o.auto_select_gpus(), "true|false: with a device count on cuda, pick free GPUs");
  add(app, "--num-nodes", o.num_nodes(), "nodes in the job")->check(CLI::Range(1, 1 << 20));
  add(app, "--precision", o.precision(), "32-true|64-true|bf16-mixed|16-mixed");
  add(app, "--sync-batchnorm", o.sync_batchnorm(), "true|false: SyncBatchNorm under DDP");
  add(app, "--process-group-backend", o.process_group_backend(), backend_help());
  add(app, "--timeout", o.timeout(), "seconds a collective may block before it fails")->check(CLI::Range(0.001, 1e9));
  add(app, "--liveness-timeout", o.liveness_timeout(), "seconds after which a rank that stopped answering ends the job; 0: off")
      ->check(CLI::Range(0.0, 1e9));
  add(app, "--distributed-debug", o.distributed_debug(), "off|detail: the ranks compare each collective's call first");
  add(app, "--max-restarts", o.max_restarts(), "self-launch: start the job again after a failure, up to N times")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
}

// The Tuner's searches, run by fit before it trains.
void add_tuner_flags(CLI::App& app, TrainerOptions& o) {
  add(app, "--lr-find", o.lr_find(), "true|false: run the LR finder before training and train with its suggestion")
      ->expected(0, 1)
      ->default_str("true");  // the flag alone
  add(app, "--scale-batch-size", o.scale_batch_size(),
      "power|binsearch: find the largest training batch size that fits in memory before training")
      ->check(CLI::IsMember({"", "power", "binsearch"}));
}

// Where a fit starts from: a checkpoint to resume, or weights to begin with.
void add_resume_flags(CLI::App& g, TrainerOptions& o) {
  add(g, "--ckpt-path", o.ckpt_path(), "checkpoint to resume from (this Trainer's or Lightning's .ckpt), or 'last'");
  add(g, "--ckpt-path-rename", o.ckpt_path_rename(),
      "FROM=TO,...: rename prefixes of a Lightning --ckpt-path's names (found by matching when not given)");
  add(g, "--init-weights", o.init_weights(),
      "weights to start from (Python's torch.save(model.state_dict(), path), or a .safetensors file); "
      "not a resume, see --ckpt-path");
  add(g, "--init-weights-rename", o.init_weights_rename(),
      "FROM=TO,...: rename prefixes of --init-weights' names ('model.=' strips model.)");
  add(g, "--init-weights-strict", o.init_weights_strict(),
      "true|false: every name must match (false skips missing and extra names)");
}

}  // namespace

// The closest of `known` to `given`, if it is close enough to be a typo; else "".
std::string detail::nearest(const std::string& given, const std::vector<std::string>& known) {
  std::string best;
  size_t best_distance = std::max<size_t>(2, given.size() / 3) + 1;
  for (const auto& name : known) {
    const size_t d = distance(given, name);
    if (d < best_distance) {
      best = name;
      best_distance = d;
    }
  }
  return best;
}

void add_plan_flags(CLI::App& app, PlanOptions& o) {
  const size_t before = app.get_options().size();
  add_plan_flags_of(app, o);
  detail::add_fsdp_flags(app, o, /*trainer_checkpoints=*/false);
  const auto options = app.get_options();
  detail::enable_config(app, {options.begin() + static_cast<std::ptrdiff_t>(before), options.end()});
}

void add_trainer_flags(CLI::App& app, TrainerOptions& o) {
  auto* group = app.add_option_group("Trainer", "Trainer flags (each also LOCKSTEP_TRAINER_<FLAG>)");
  auto& g = *group;
  add_plan_flags_of(g, o);
  detail::add_fsdp_flags(g, o, /*trainer_checkpoints=*/true);
  add(g, "--max-epochs", o.max_epochs(), "stop after this many epochs (-1: 1000 unless --max-steps)")
      ->check(CLI::Range(int64_t{-1}, int64_t{1} << 40));
  add(g, "--max-steps", o.max_steps(), "stop after this many optimizer steps (-1: no limit)")
      ->check(CLI::Range(int64_t{-1}, int64_t{1} << 50));
  add(g, "--accumulate-grad-batches", o.accumulate_grad_batches(), "batches per optimizer step")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  add(g, "--gradient-clip-val", o.gradient_clip_val(), "clip gradients to this norm or value (0: off)")
      ->check(CLI::Range(0.0, 1e12));
  add(g, "--gradient-clip-algorithm", o.gradient_clip_algorithm(), "norm|value")->check(CLI::IsMember({"norm", "value"}));
  add_seed_flag(g, o.seed());
  add(g, "--deterministic", o.deterministic(), "true|false: deterministic algorithms only")
      ->check(CLI::Validator(refuse_deterministic_warn, "true|false"));
  add(g, "--default-root-dir", o.default_root_dir(), "where logs and checkpoints go");
  add_resume_flags(g, o);
  add_limit(g, "--limit-train-batches", o.limit_train_batches(), "fraction (0.25) or count (10) of training batches");
  add_limit(g, "--limit-val-batches", o.limit_val_batches(), "fraction or count of validation batches");
  add_limit(g, "--limit-test-batches", o.limit_test_batches(), "fraction or count of test batches");
  add_limit(g, "--overfit-batches", o.overfit_batches(),
            "train and validate on this fraction or count of batches only, unshuffled (0: off)");
  add_limit(g, "--val-check-interval", o.val_check_interval(),
            "validate every fraction (0.25) of the epoch or every N (100) training batches");
  add(g, "--check-val-every-n-epoch", o.check_val_every_n_epoch(), "validate every N epochs")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  add(g, "--num-sanity-val-steps", o.num_sanity_val_steps(), "validation batches before training (-1: all)")
      ->check(CLI::Range(int64_t{-1}, int64_t{1} << 40));
  add(g, "--log-every-n-steps", o.log_every_n_steps(), "write metrics every N steps")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  add(g, "--enable-progress-bar", o.enable_progress_bar(), "true|false");
  add(g, "--enable-model-summary", o.enable_model_summary(), "true|false");
  add(g, "--fast-dev-run", o.fast_dev_run(), "run N batches of each loop once, writing nothing (default 0: off)")
      ->expected(0, 1)
      ->default_str("1")  // the flag alone, as Lightning's fast_dev_run=True
      ->option_text("[N]")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  add(g, "--enable-checkpointing", o.enable_checkpointing(), "true|false");
  add(g, "--inference-mode", o.inference_mode(), "true|false: evaluate under InferenceMode (false: NoGradGuard)");
  add(g, "--use-distributed-sampler", o.use_distributed_sampler(), "true|false");
  add(g, "--detect-anomaly", o.detect_anomaly(), "true|false: autograd anomaly mode (names the op that made a NaN)");
  add(g, "--benchmark", o.benchmark(), "true|false: cudnn.benchmark (CUDA; no effect on the CPU)");
  add(g, "--profiler", o.profiler(), "simple|pytorch|false: the time per hook when fit ends, or a trace per rank")
      ->transform(CLI::Validator(read_profiler, "simple|pytorch|false"));
  add_tuner_flags(g, o);
  add_retired(app, retired_plan_flags);
  add_retired(app, retired_trainer_flags);
  add_retired(app, lightning_only_flags);
  detail::enable_config(app, detail::options_of(g));
}

void add_fabric_flags(CLI::App& app, FabricOptions& o, int64_t& seed) {
  auto& g = *app.add_option_group("Fabric", "Fabric flags (each also LOCKSTEP_TRAINER_<FLAG>)");
  add_plan_flags(g, o);
  add_seed_flag(g, seed);
  add_retired(app, retired_plan_flags);
  detail::enable_config(app, detail::options_of(g));
}

namespace {

// The position of an empty argument that is not the value of the flag before it ("--ckpt-path ''"),
// or 0. Debian's CLI11 2.1 drops such an argument silently, and loops forever when more arguments
// follow it in an app with option groups (`prog '' --x`, `prog -- '' x`; found by tests/fuzz).
int stray_empty_argument(const CLI::App& app, int argc, char** argv) {
  bool positional_only = false;  // after "--"
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--" && !positional_only) {
      positional_only = true;
      continue;
    }
    if (!arg.empty()) continue;
    const std::string before = argv[i - 1];
    const CLI::Option* flag = !positional_only && i > 1 && before.rfind('-', 0) == 0 &&
                                      before.find('=') == std::string::npos
                                  ? app.get_option_no_throw(before)
                                  : nullptr;
    if (flag == nullptr || flag->get_type_size() == 0) return i;
  }
  return 0;
}

}  // namespace

int parse_or_exit_code(CLI::App& app, int argc, char** argv) {
  std::vector<std::string> flags, variables;
  collect_names(app, &flags, &variables);
  const std::string program = short_name(app.get_name().empty() && argc > 0 ? argv[0] : app.get_name());
  if (const int at = stray_empty_argument(app, argc, argv)) {
    std::cerr << program << ": error: argument " << at << " is empty and belongs to no flag; remove it (an empty "
              << "value goes right after its flag, or as --flag=)\n"
              << program << ": run '" << program << " --help' for the flags and their values.\n";
    return 2;
  }
  if (app.get_version_ptr() == nullptr) {
    app.set_version_flag("--version", program + " (Lockstep " LOCKSTEP_VERSION_STRING ", built against LibTorch " +
                                          std::string(TORCH_VERSION) + ")");
  }
  try {
    app.parse(argc, argv);
    warn_about_unknown_variables(program, variables);
    bool print = false;
    set_program_config(detail::resolved_config(app, print));
    if (!print) return -1;
    std::cout << program_config() << std::flush;
    return 0;
  } catch (const UsageError& e) {  // a --config file's (yaml_config.cpp)
    std::cerr << program << ": error: " << e.what() << "\n";
    return 2;
  } catch (const CLI::CallForVersion& e) {
    std::cout << e.what() << "\n";
    return 0;
  } catch (const CLI::ExtrasError& e) {
    for (const auto& word : app.remaining()) {
      if (word.rfind("--", 0) != 0) continue;
      const std::string flag = word.substr(0, word.find('='));
      const std::string near = nearest(flag, flags);
      std::cerr << program << ": error: unknown flag " << flag << (near.empty() ? "" : "; did you mean " + near + "?")
                << "\n" << program << ": run '" << program << " --help' for the flags and their values.\n";
      return 2;
    }
    std::cerr << program << ": error: " << e.what() << "\n"
              << program << ": run '" << program << " --help' for the flags and their values.\n";
    return 2;
  } catch (const CLI::FileError& e) {  // a --config file that cannot be read
    std::cerr << program << ": error: --config: " << e.what() << ". Give the path of a YAML file, e.g. a run's "
              << "lockstep_logs/version_N/config.yaml.\n";
    return 2;
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return 0;
  } catch (const CLI::CallForAllHelp&) {
    std::cout << app.help("", CLI::AppFormatMode::All);
    return 0;
  } catch (const CLI::ParseError& e) {
    std::cerr << program << ": error: " << e.what() << "\n"
              << program << ": run '" << program << " --help' for the flags and their values.\n";
    return 2;
  }
}

}  // namespace cli
}  // namespace lockstep
