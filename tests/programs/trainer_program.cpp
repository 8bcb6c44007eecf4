// A Trainer run driven by the Trainer flags, for the multi-process Trainer tests and the
// bad-input table: trains tests/support/regression.h's model and writes each rank's parameters.
//   trainer_program [trainer flags] --out DIR [--batch-size B] [--adam] [--save PATH] [--val] [--csv-logger]
//                   [--fail-on-rank R] [--pause-ms MS]
// With --val it also validates (32 examples) and writes each rank's validation count. With
// --csv-logger every rank adds its own CSVLogger under --default-root-dir, as a user might. With
// --fail-on-rank R, rank R throws after its first training batch (an error in a training step).
// With --pause-ms, every rank writes its pid to DIR/paused.<rank> after its first batch and
// sleeps that long (a live job for tests to inspect).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>

#include <lockstep/cli/guarded_main.h>
#include <lockstep/cli/trainer_flags.h>
#include <lockstep/loggers/csv_logger.h>
#include <lockstep/trainer/trainer.h>

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

// Pauses every rank once, after its first training batch, announcing it in a file.
struct PauseOnce : lockstep::Callback {
  PauseOnce(std::string out, int ms) : out(std::move(out)), ms(ms) {}
  std::string name() const override { return "PauseOnce"; }
  void on_train_batch_end(lockstep::TrainerView& trainer, lockstep::TrainingModule&, const torch::Tensor&,
                          int64_t batch_idx) override {
    if (batch_idx != 0 || trainer.current_epoch() != 0) return;
    const std::string file = out + "/paused." + std::to_string(trainer.global_rank());
    { std::ofstream(file + ".partial") << ::getpid() << "\n"; }
    std::rename((file + ".partial").c_str(), file.c_str());
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  }
  std::string out;
  int ms;
};

}  // namespace

int main(int argc, char** argv) {
  return lockstep::cli::guarded_main("trainer_program", [&] {
    CLI::App app{"trainer test program", "trainer_program"};
    lockstep::TrainerOptions options;
    lockstep::cli::add_trainer_flags(app, options);
    std::string out, save;
    int64_t batch_size = 8;
    bool adam = false, validate = false, csv_logger = false;
    int fail_on_rank = -1, pause_ms = 0;
    app.add_option("--out", out)->required();
    app.add_option("--batch-size", batch_size);
    app.add_option("--save", save);
    app.add_flag("--adam", adam);
    app.add_flag("--val", validate);
    app.add_flag("--csv-logger", csv_logger);
    app.add_option("--fail-on-rank", fail_on_rank);
    app.add_option("--pause-ms", pause_ms);
    const int parsed = lockstep::cli::parse_or_exit_code(app, argc, argv);
    if (parsed >= 0) return parsed;
    torch::set_num_threads(1);
    torch::manual_seed(11);
    auto model = std::make_shared<lockstep::testing::Regressor>(adam);
    auto data = lockstep::testing::regression_data(64);
    lockstep::Trainer trainer(options.enable_progress_bar(false).num_sanity_val_steps(0));
    if (csv_logger) {
      trainer.add_logger(std::make_shared<lockstep::loggers::CSVLogger>(
          lockstep::loggers::LoggerOptions(options.default_root_dir())));
    }
    if (fail_on_rank >= 0) trainer.add_callback(std::make_shared<FailOnRank>(fail_on_rank));
    if (pause_ms > 0) trainer.add_callback(std::make_shared<PauseOnce>(out, pause_ms));
    auto validations = std::make_shared<CountValidations>();
    std::shared_ptr<lockstep::DataLoader> val;
    if (validate) {
      trainer.add_callback(validations);
      val = std::make_shared<lockstep::DataLoader>(lockstep::testing::regression_data(32, 8, 9),
                                                   lockstep::DataLoaderOptions(batch_size));
    }
    trainer.fit(model, std::make_shared<lockstep::DataLoader>(data, lockstep::DataLoaderOptions(batch_size).shuffle(true).seed(4)), val);
    if (!save.empty()) trainer.save_checkpoint(save);
    const std::string rank = std::to_string(trainer.global_rank());
    torch::save(model->parameters(), out + "/params." + rank + ".pt");
    std::ofstream(out + "/done." + rank) << trainer.global_step() << "\n";
    if (validate) std::ofstream(out + "/validations." + rank) << validations->count << "\n";
    return 0;
  });
}
