// A Trainer run driven by the Trainer flags, for the multi-process Trainer tests and the
// bad-input table: trains tests/support/regression.h's model and writes each rank's parameters.
//   trainer_program [trainer flags] --out DIR [--batch-size B] [--adam] [--save PATH] [--val] [--csv-logger]
//                   [--fail-on-rank R] [--pause-ms MS [--pause-on-rank R]] [--nan-at-step S --nan-on-rank R]
//                   [--crash-at-step S --crash-on-rank R] [--checkpoint-every-n-steps K]
//                   [--checkpoint-every-seconds T] [--step-ms MS] [--keep-resumed]
//                   [--manual plain|twice|manual_backward] [--features F] [--lr LR]
// With --val it also validates (32 examples) and writes each rank's validation count. With
// --csv-logger every rank adds its own CSVLogger under --default-root-dir, as a user might. With
// --fail-on-rank R, rank R throws after its first training batch (an error in a training step).
// With --pause-ms, every rank writes its pid to DIR/paused.<rank> after its first batch and
// sleeps that long (a live job for tests to inspect). With --nan-at-step S, rank --nan-on-rank's
// loss in optimizer step S (1, 2, ...) is NaN. With --crash-at-step S, rank --crash-on-rank exits
// with code 3 after step S, in the first attempt of a job only (TORCHELASTIC_RESTART_COUNT unset
// or 0). --checkpoint-every-n-steps K keeps a checkpoint of every K-th step and last.ckpt;
// --checkpoint-every-seconds T one every T seconds of wall time (train_time_interval), and every
// rank writes DIR/saved.<rank>: the global step of each checkpoint it took part in, one a line.
// --manual: manual optimisation, each step's backward as loss.backward() (plain), as two
// loss.backward() calls of half the loss each (twice), or as manual_backward(loss). --features F
// (default 8): the inputs' width, so that a checkpoint of one width is a wider model's for another.
// --lr LR: the optimizer's learning rate instead of the model's own. Every rank writes
// DIR/tuned.<rank>: the learning rate and the training batch size fit ended with (--lr-find and
// --scale-batch-size set them), the rate with 17 digits. --step-ms MS: every training batch lasts
// at least MS milliseconds (a step of known length; a job slow enough for a test to lose a node
// mid-epoch), and each rank appends
// "<global step> <world size> <unix ms>" to DIR/steps.<rank> after each batch, and each process
// "<unix ms> <RANK> <WORLD_SIZE>" to DIR/starts when it starts. --keep-resumed: a run that resumed
// copies, on rank 0 when fit starts, the last.ckpt it resumed (a file, or a sharded checkpoint's
// directory) to DIR/resumed.<step>.ckpt (a later attempt of the job overwrites last.ckpt).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <fstream>
#include <thread>

#include <lockstep/callbacks/model_checkpoint.h>
#include <lockstep/cli/guarded_main.h>
#include <lockstep/cli/trainer_flags.h>
#include <lockstep/loggers/csv_logger.h>
#include <lockstep/trainer/trainer.h>

#include "../support/fork_server.h"
#include "../support/regression.h"

namespace {

// Validations that ran during fit, sanity checks not counted.
struct CountValidations : lockstep::Callback {
  std::string name() const override { return "CountValidations"; }
  void on_validation_end(lockstep::TrainerView& trainer, lockstep::TrainingModule&) override {
    if (!trainer.sanity_checking()) ++count;
  }
  int64_t count = 0;
};

// Throws on one rank after its first training batch.
struct FailOnRank : lockstep::Callback {
  explicit FailOnRank(int rank) : rank(rank) {}
  std::string name() const override { return "FailOnRank"; }
  void on_train_batch_end(lockstep::TrainerView& trainer, lockstep::TrainingModule&, const torch::Tensor&,
                          int64_t) override {
    if (trainer.global_rank() == rank) throw std::runtime_error("rank " + std::to_string(rank) + " fails on purpose");
  }
  int rank;
};

// Pauses every rank (or only `rank`) once, after its first training batch, announcing it in a file.
struct PauseOnce : lockstep::Callback {
  PauseOnce(std::string out, int ms, int rank) : out(std::move(out)), ms(ms), rank(rank) {}
  std::string name() const override { return "PauseOnce"; }
  void on_train_batch_end(lockstep::TrainerView& trainer, lockstep::TrainingModule&, const torch::Tensor&,
                          int64_t batch_idx) override {
    if (batch_idx != 0 || trainer.current_epoch() != 0 || (rank >= 0 && trainer.global_rank() != rank)) return;
    const std::string file = out + "/paused." + std::to_string(trainer.global_rank());
    { std::ofstream(file + ".partial") << ::getpid() << "\n"; }
    std::rename((file + ".partial").c_str(), file.c_str());
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  }
  std::string out;
  int ms;
  int rank;
};

// Records the global step of every checkpoint this rank takes part in (rank 0 alone writes).
struct SaveRecordingTrainer : lockstep::Trainer {
  using lockstep::Trainer::Trainer;
  void save_checkpoint(const std::string& path) override {
    saved_steps.push_back(global_step());
    lockstep::Trainer::save_checkpoint(path);
  }
  std::vector<int64_t> saved_steps;
};

// Ends one rank's process after one step, as a crash would, in a job's first attempt.
struct CrashOnce : lockstep::Callback {
  CrashOnce(int64_t step, int rank) : step(step), rank(rank) {}
  std::string name() const override { return "CrashOnce"; }
  void on_train_batch_end(lockstep::TrainerView& trainer, lockstep::TrainingModule&, const torch::Tensor&,
                          int64_t) override {
    const char* attempt = std::getenv("TORCHELASTIC_RESTART_COUNT");
    if (attempt != nullptr && std::string(attempt) != "0") return;
    if (trainer.global_step() == step && trainer.global_rank() == rank) {
      std::fprintf(stderr, "trainer_program: rank %d crashes after step %lld on purpose\n", rank,
                   static_cast<long long>(step));
      std::_Exit(3);
    }
  }
  int64_t step;
  int rank;
};

int64_t unix_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Every training batch lasts at least `ms` milliseconds (added before ModelCheckpoint, which then
// reads the clock after the sleep); records when each step ended, for tests that act mid-epoch.
struct SlowSteps : lockstep::Callback {
  SlowSteps(std::string out, int ms) : out(std::move(out)), ms(ms) {}
  std::string name() const override { return "SlowSteps"; }
  void on_train_batch_end(lockstep::TrainerView& trainer, lockstep::TrainingModule&, const torch::Tensor&,
                          int64_t) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    std::ofstream(out + "/steps." + std::to_string(trainer.global_rank()), std::ios::app)
        << trainer.global_step() << " " << trainer.world_size() << " " << unix_ms() << "\n";
  }
  std::string out;
  int ms;
};

// Keeps the checkpoint a resumed run started from.
struct KeepResumed : lockstep::Callback {
  explicit KeepResumed(std::string out) : out(std::move(out)) {}
  std::string name() const override { return "KeepResumed"; }
  void on_fit_start(lockstep::TrainerView& trainer, lockstep::TrainingModule&) override {
    if (trainer.global_rank() != 0 || trainer.global_step() == 0) return;
    const std::string copy = out + "/resumed." + std::to_string(trainer.global_step()) + ".ckpt";
    std::filesystem::remove_all(copy);
    std::filesystem::copy(trainer.log_dir() + "/checkpoints/last.ckpt", copy, std::filesystem::copy_options::recursive);
  }
  std::string out;
};

// The regression model whose loss is NaN on one rank in one step.
struct NanOnce : lockstep::testing::Regressor {
  NanOnce(bool adam, int64_t step, int rank) : Regressor(adam), step(step), rank(rank) {}
  torch::Tensor training_step(lockstep::Batch& batch, int64_t batch_idx) override {
    auto loss = Regressor::training_step(batch, batch_idx);
    const bool here = trainer()->global_step() + 1 == step && trainer()->global_rank() == rank;
    return here ? loss * std::numeric_limits<float>::quiet_NaN() : loss;
  }
  int64_t step;
  int rank;
};

// The regression model, optimised by hand in its training step.
struct Manual : lockstep::testing::Regressor {
  Manual(bool adam, std::string how) : Regressor(adam), how(std::move(how)) { automatic_optimization(false); }
  torch::Tensor training_step(lockstep::Batch& batch, int64_t) override {
    auto& optimizer = *optimizers().front();
    optimizer.zero_grad();
    auto loss = torch::mse_loss(forward(batch.data), batch.target);
    if (how == "manual_backward") {
      manual_backward(loss);
    } else if (how == "twice") {
      (loss / 2).backward({}, /*retain_graph=*/true);
      (loss / 2).backward();
    } else {
      loss.backward();
    }
    optimizer.step();
    return loss.detach();
  }
  std::string how;
};

// The regression model with another learning rate.
struct WithLr : lockstep::testing::Regressor {
  WithLr(bool adam, int64_t features, double lr) : Regressor(adam, features), lr(lr) {}
  lockstep::OptimizerConfig configure_optimizers() override {
    if (adam) return std::make_shared<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(lr));
    return std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(lr).momentum(0.9));
  }
  double lr;
};

// The program; main() below runs it, or serves forks of it (TrainerBadInput's runs).
int run(int argc, char** argv) {
  return lockstep::cli::guarded_main("trainer_program", [&] {
    CLI::App app{"trainer test program", "trainer_program"};
    lockstep::TrainerOptions options;
    lockstep::cli::add_trainer_flags(app, options);
    std::string out, save, manual;
    int64_t batch_size = 8;
    bool adam = false, validate = false, csv_logger = false, keep_resumed = false;
    int fail_on_rank = -1, pause_ms = 0, step_ms = 0, pause_on_rank = -1, nan_on_rank = 0, crash_on_rank = 1;
    int64_t nan_at_step = 0, crash_at_step = 0, checkpoint_every = 0, features = 8;
    double lr = 0, checkpoint_seconds = 0;
    app.add_option("--out", out)->required();
    app.add_option("--batch-size", batch_size);
    app.add_option("--save", save);
    app.add_flag("--adam", adam);
    app.add_flag("--val", validate);
    app.add_flag("--csv-logger", csv_logger);
    app.add_option("--fail-on-rank", fail_on_rank);
    app.add_option("--pause-ms", pause_ms);
    app.add_option("--pause-on-rank", pause_on_rank);
    app.add_option("--nan-at-step", nan_at_step);
    app.add_option("--nan-on-rank", nan_on_rank);
    app.add_option("--crash-at-step", crash_at_step);
    app.add_option("--crash-on-rank", crash_on_rank);
    app.add_option("--checkpoint-every-n-steps", checkpoint_every);
    app.add_option("--checkpoint-every-seconds", checkpoint_seconds);
    app.add_option("--features", features);
    app.add_option("--lr", lr);
    app.add_option("--step-ms", step_ms);
    app.add_flag("--keep-resumed", keep_resumed);
    app.add_option("--manual", manual)->check(CLI::IsMember({"plain", "twice", "manual_backward"}));
    const int parsed = lockstep::cli::parse_or_exit_code(app, argc, argv);
    if (parsed >= 0) return parsed;
    if (step_ms > 0) {
      const char* rank = std::getenv("RANK");
      const char* world = std::getenv("WORLD_SIZE");
      std::ofstream(out + "/starts", std::ios::app) << unix_ms() << " " << (rank ? rank : "-") << " "
                                                    << (world ? world : "-") << "\n";
    }
    torch::set_num_threads(1);
    torch::manual_seed(11);
    std::shared_ptr<lockstep::testing::Regressor> model;
    if (nan_at_step > 0) {
      model = std::make_shared<NanOnce>(adam, nan_at_step, nan_on_rank);
    } else if (!manual.empty()) {
      model = std::make_shared<Manual>(adam, manual);
    } else if (lr > 0) {
      model = std::make_shared<WithLr>(adam, features, lr);
    } else {
      model = std::make_shared<lockstep::testing::Regressor>(adam, features);
    }
    auto data = lockstep::testing::regression_data(64, features);
    SaveRecordingTrainer trainer(options.enable_progress_bar(false).num_sanity_val_steps(0));
    if (csv_logger) {
      trainer.add_logger(std::make_shared<lockstep::loggers::CSVLogger>(
          lockstep::loggers::LoggerOptions(options.default_root_dir())));
    }
    if (fail_on_rank >= 0) trainer.add_callback(std::make_shared<FailOnRank>(fail_on_rank));
    if (pause_ms > 0) trainer.add_callback(std::make_shared<PauseOnce>(out, pause_ms, pause_on_rank));
    if (step_ms > 0) trainer.add_callback(std::make_shared<SlowSteps>(out, step_ms));
    if (keep_resumed) trainer.add_callback(std::make_shared<KeepResumed>(out));
    if (crash_at_step > 0) trainer.add_callback(std::make_shared<CrashOnce>(crash_at_step, crash_on_rank));
    if (checkpoint_seconds > 0) {
      trainer.add_callback(std::make_shared<lockstep::ModelCheckpoint>(
          lockstep::ModelCheckpointOptions().train_time_interval(checkpoint_seconds).save_top_k(-1)));
    }
    if (checkpoint_every > 0) {
      trainer.add_callback(std::make_shared<lockstep::ModelCheckpoint>(
          lockstep::ModelCheckpointOptions().every_n_train_steps(checkpoint_every).save_top_k(-1).save_last(true)));
    }
    auto validations = std::make_shared<CountValidations>();
    std::shared_ptr<lockstep::DataLoader> val;
    if (validate) {
      trainer.add_callback(validations);
      val = std::make_shared<lockstep::DataLoader>(lockstep::testing::regression_data(32, 8, 9),
                                                   lockstep::DataLoaderOptions(batch_size));
    }
    auto train = std::make_shared<lockstep::DataLoader>(data, lockstep::DataLoaderOptions(batch_size).shuffle(true).seed(4));
    trainer.fit(model, train, val);
    if (!save.empty()) trainer.save_checkpoint(save);
    const std::string rank = std::to_string(trainer.global_rank());
    torch::save(model->parameters(), out + "/params." + rank + ".pt");
    std::ofstream(out + "/done." + rank) << trainer.global_step() << "\n";
    char tuned[64];
    std::snprintf(tuned, sizeof(tuned), "%.17g %lld\n", trainer.optimizers().front()->param_groups().front().options().get_lr(),
                  static_cast<long long>(train->options().batch_size()));
    std::ofstream(out + "/tuned." + rank) << tuned;
    if (validate) std::ofstream(out + "/validations." + rank) << validations->count << "\n";
    if (checkpoint_seconds > 0) {
      std::ofstream saved(out + "/saved." + rank);
      for (int64_t step : trainer.saved_steps) saved << step << "\n";
    }
    return 0;
  });
}

}  // namespace

int main(int argc, char** argv) { return lockstep::testing::program_main(argc, argv, run); }
