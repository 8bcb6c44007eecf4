// A Trainer job with weight averaging, for tests/unit/callbacks/weight_averaging_test.cpp:
//   averaging_program [trainer flags] --out DIR --average ema|swa [--decay D] [--swa-lr LR]
//                     [--swa-epoch-start S] [--annealing-epochs A] [--checkpoint-every-n-steps K]
//                     [--batch-norm] [--val]
// Each rank writes DIR/records.<rank>.pt: after every update (each optimizer step for ema, each
// epoch end for swa) its weights and the average, each the concatenation of its local values
// (whole under DDP, its pieces under FSDP) in name order, and the learning rate as a 1-element
// tensor: [w, a, lr, w, a, lr, ...]. After fit, DIR/final.<rank>.pt holds [weights, average,
// buffers] and DIR/counts.<rank> "n_averaged latest_update_step".
#include <fstream>

#include <lockstep/callbacks/model_checkpoint.h>
#include <lockstep/callbacks/stochastic_weight_averaging.h>
#include <lockstep/callbacks/weight_averaging.h>
#include <lockstep/cli/guarded_main.h>
#include <lockstep/cli/trainer_flags.h>
#include <lockstep/trainer/trainer.h>

#include "../support/fork_server.h"
#include "../support/regression.h"

namespace {

using lockstep::TrainerView;
using lockstep::TrainingModule;

// The regression model with a batch norm layer after its first linear one.
struct Normed : lockstep::testing::Regressor {
  Normed() { bn = register_module("bn", torch::nn::BatchNorm1d(16)); }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(bn(fc1(x)))); }
  torch::Tensor training_step(lockstep::Batch& batch, int64_t) override {
    return torch::mse_loss(forward(batch.data), batch.target);
  }
  void validation_step(lockstep::Batch& batch, int64_t) override {
    log("val_loss", torch::mse_loss(forward(batch.data), batch.target));
  }
  torch::nn::BatchNorm1d bn{nullptr};
};

torch::Tensor concat(const std::map<std::string, torch::Tensor>& values) {
  std::vector<torch::Tensor> flat;
  for (const auto& item : values) flat.push_back(item.second.detach().reshape({-1}).to(torch::kFloat64));
  return flat.empty() ? torch::zeros({0}, torch::kFloat64) : torch::cat(flat);
}

// The weights the average holds, as this rank holds them.
torch::Tensor local_of(TrainerView& trainer, const std::map<std::string, torch::Tensor>& like) {
  std::map<std::string, torch::Tensor> mine;
  for (const auto& [name, tensor] : trainer.local_weights()) {
    if (like.count(name)) mine.emplace(name, tensor);
  }
  return concat(mine);
}

struct Recorder : lockstep::Callback {
  explicit Recorder(std::shared_ptr<lockstep::WeightAveraging> averaging) : averaging(std::move(averaging)) {}
  std::string name() const override { return "Recorder"; }
  void record(TrainerView& trainer) {
    const auto& average = averaging->average();
    records.push_back(local_of(trainer, average));
    records.push_back(concat(average));
    records.push_back(torch::full({1}, trainer.optimizers().front()->param_groups()[0].options().get_lr(), torch::kFloat64));
  }
  void on_train_batch_end(TrainerView& trainer, TrainingModule&, const torch::Tensor&, int64_t) override {
    if (!by_epoch && averaging->latest_update_step() == trainer.global_step()) record(trainer);
  }
  void on_train_epoch_end(TrainerView& trainer, TrainingModule&) override {
    if (by_epoch && averaging->n_averaged() > 0) record(trainer);
  }
  std::shared_ptr<lockstep::WeightAveraging> averaging;
  bool by_epoch = false;
  std::vector<torch::Tensor> records;
};

int run(int argc, char** argv) {
  return lockstep::cli::guarded_main("averaging_program", [&] {
    CLI::App app{"weight averaging test program", "averaging_program"};
    lockstep::TrainerOptions options;
    lockstep::cli::add_trainer_flags(app, options);
    std::string out, average = "ema";
    double decay = 0.9, swa_lr = 0.01, swa_epoch_start = 2;
    int64_t annealing_epochs = 1, checkpoint_every = 0;
    bool batch_norm = false, validate = false;
    app.add_option("--out", out)->required();
    app.add_option("--average", average)->check(CLI::IsMember({"ema", "swa"}));
    app.add_option("--decay", decay);
    app.add_option("--swa-lr", swa_lr);
    app.add_option("--swa-epoch-start", swa_epoch_start);
    app.add_option("--annealing-epochs", annealing_epochs);
    app.add_option("--checkpoint-every-n-steps", checkpoint_every);
    app.add_flag("--batch-norm", batch_norm);
    app.add_flag("--val", validate);
    const int parsed = lockstep::cli::parse_or_exit_code(app, argc, argv);
    if (parsed >= 0) return parsed;
    torch::set_num_threads(1);
    torch::manual_seed(11);
    std::shared_ptr<lockstep::testing::Regressor> model;
    if (batch_norm) {
      model = std::make_shared<Normed>();
    } else {
      model = std::make_shared<lockstep::testing::Regressor>(true);
    }
    lockstep::Trainer trainer(options.enable_progress_bar(false).num_sanity_val_steps(0));
    std::shared_ptr<lockstep::WeightAveraging> averaging;
    if (average == "ema") {
      averaging = std::make_shared<lockstep::EMAWeightAveraging>(lockstep::EMAWeightAveragingOptions().decay(decay));
    } else {
      averaging = std::make_shared<lockstep::StochasticWeightAveraging>(
          lockstep::StochasticWeightAveragingOptions(swa_lr).swa_epoch_start(swa_epoch_start).annealing_epochs(annealing_epochs));
    }
    auto recorder = std::make_shared<Recorder>(averaging);
    recorder->by_epoch = average == "swa";
    trainer.add_callback(averaging);
    trainer.add_callback(recorder);
    if (checkpoint_every > 0) {
      trainer.add_callback(std::make_shared<lockstep::ModelCheckpoint>(
          lockstep::ModelCheckpointOptions().every_n_train_steps(checkpoint_every).save_top_k(-1).save_last(true)));
    }
    std::shared_ptr<lockstep::DataLoader> val;
    if (validate) {
      val = std::make_shared<lockstep::DataLoader>(lockstep::testing::regression_data(32, 8, 9), lockstep::DataLoaderOptions(8));
    }
    auto data = lockstep::testing::regression_data(64);
    trainer.fit(model, std::make_shared<lockstep::DataLoader>(data, lockstep::DataLoaderOptions(8).shuffle(true).seed(4)), val);
    const std::string rank = std::to_string(trainer.global_rank());
    torch::save(recorder->records, out + "/records." + rank + ".pt");
    std::vector<torch::Tensor> buffers{torch::zeros({0}, torch::kFloat64)};
    for (const auto& b : model->buffers()) buffers.push_back(b.detach().to(torch::kFloat64).reshape({-1}));
    torch::save(std::vector<torch::Tensor>{local_of(trainer, averaging->average()), concat(averaging->average()),
                                           torch::cat(buffers)},
                out + "/final." + rank + ".pt");
    std::ofstream(out + "/counts." + rank) << averaging->n_averaged() << " " << averaging->latest_update_step() << "\n";
    return 0;
  });
}

}  // namespace

int main(int argc, char** argv) { return lockstep::testing::program_main(argc, argv, run); }
