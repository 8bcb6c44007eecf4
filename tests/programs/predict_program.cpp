// Predict and validate with the Trainer on its ranks, for the multi-rank predict and validation
// tests (tests/unit/trainer/trainer_predict_test.cpp):
//   predict_program [trainer flags] --out DIR [--examples N] [--batch-size B]
// Over N regression examples (tests/support/regression.h) with an untrained Regressor, whose
// predict_step returns each example's features and the model's output (9 columns), each rank
// writes to DIR: own.<rank>.pt, its own predict outputs (without gather); gathered.<rank>.pt,
// the outputs of PredictOptions().gather(true); and
// val.<rank>.<batch size>, its val_loss for a validation in batches of B and of 83 (the last
// batch of a padded rank then holds its repeat alone), written to 17 digits.
#include <cstdio>
#include <fstream>

#include <lockstep/cli/guarded_main.h>
#include <lockstep/cli/trainer_flags.h>
#include <lockstep/trainer/trainer.h>

#include "../support/fork_server.h"
#include "../support/regression.h"

namespace {

// Each example's 8 features, then the model's output: the features check the order bit for bit
// (a row of a matrix product may differ in its last bits with the number of rows multiplied).
struct Predictor : lockstep::testing::Regressor {
  torch::Tensor predict_step(lockstep::Batch& batch, int64_t) override {
    return torch::cat({batch.data, forward(batch.data)}, 1);
  }
};

std::string seventeen_digits(double value) {
  char text[64];
  std::snprintf(text, sizeof text, "%.17g", value);
  return text;
}

int run(int argc, char** argv) {
  return lockstep::cli::guarded_main("predict_program", [&] {
    CLI::App app{"predict test program", "predict_program"};
    lockstep::TrainerOptions options;
    lockstep::cli::add_trainer_flags(app, options);
    std::string out;
    int64_t examples = 250, batch_size = 8;
    app.add_option("--out", out)->required();
    app.add_option("--examples", examples);
    app.add_option("--batch-size", batch_size);
    const int parsed = lockstep::cli::parse_or_exit_code(app, argc, argv);
    if (parsed >= 0) return parsed;
    torch::set_num_threads(1);
    torch::manual_seed(11);
    auto model = std::make_shared<Predictor>();
    auto data = lockstep::testing::regression_data(examples);
    lockstep::Trainer trainer(options.enable_progress_bar(false).enable_checkpointing(false));
    auto loader = [&](int64_t b) {
      return std::make_shared<lockstep::DataLoader>(data, lockstep::DataLoaderOptions(b));
    };
    std::map<int64_t, double> val_loss;
    for (int64_t b : {batch_size, int64_t{83}}) val_loss[b] = trainer.validate(model, loader(b)).at("val_loss");
    auto predict_loader = loader(batch_size);
    const auto own = trainer.predict(model, predict_loader);
    const auto gathered = trainer.predict(model, predict_loader, lockstep::PredictOptions().gather(true));
    const std::string rank = std::to_string(trainer.global_rank());
    torch::save(own, out + "/own." + rank + ".pt");
    torch::save(gathered, out + "/gathered." + rank + ".pt");
    for (const auto& [b, value] : val_loss) {
      std::ofstream(out + "/val." + rank + "." + std::to_string(b)) << seventeen_digits(value) << "\n";
    }
    return 0;
  });
}

}  // namespace

int main(int argc, char** argv) { return lockstep::testing::program_main(argc, argv, run); }
