// The Trainer flags Lightning users type for debugging and evaluation: --overfit-batches,
// --inference-mode, --detect-anomaly and --deterministic, each against what it must change.
#include <lockstep/trainer/trainer.h>

#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <lockstep/core/error.h>

#include "../../support/trainer_runs.h"

namespace lockstep {
namespace trainer_lightning_flags_test {

using testing::loader_of;

// `n` examples whose first feature is their index (0, 1, ...): a step can tell which it got.
std::shared_ptr<TensorDataset> indexed_data(int64_t n) {
  auto x = torch::randn({n, 8}, at::make_generator<at::CPUGeneratorImpl>(uint64_t{5}));
  x.select(1, 0).copy_(torch::arange(n, torch::kFloat32));
  return std::make_shared<TensorDataset>(x, x.narrow(1, 1, 1) * 0.5);
}

// The indices each training epoch and each validation saw, and each epoch's mean training loss.
struct IndexRecorder : testing::Regressor {
  torch::Tensor training_step(Batch& batch, int64_t batch_idx) override {
    if (static_cast<int64_t>(train.size()) <= current_epoch()) train.emplace_back();
    for (int64_t i = 0; i < batch.size(); ++i) train.back().push_back(batch.data[i][0].item<int64_t>());
    auto x = batch.data.clone();
    x.select(1, 0).zero_();  // the index is a label, not a feature
    auto loss = torch::mse_loss(forward(x), batch.target);
    epoch_loss.resize(train.size());
    epoch_loss.back() += loss.item<double>();
    return loss;
  }
  void validation_step(Batch& batch, int64_t batch_idx) override {
    if (trainer()->sanity_checking()) return;
    if (batch_idx == 0) val.emplace_back();
    for (int64_t i = 0; i < batch.size(); ++i) val.back().push_back(batch.data[i][0].item<int64_t>());
  }
  std::vector<std::vector<int64_t>> train, val;
  std::vector<double> epoch_loss;
};

std::vector<int64_t> first(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = i;
  return v;
}

// What an evaluation step saw of autograd's modes, and predict's outputs.
struct ModeRecorder : testing::Regressor {
  void validation_step(Batch& batch, int64_t batch_idx) override {
    record();
    Regressor::validation_step(batch, batch_idx);
  }
  void test_step(Batch& batch, int64_t) override {
    record();
    log("test_loss", torch::mse_loss(forward(batch.data), batch.target));
  }
  torch::Tensor predict_step(Batch& batch, int64_t) override {
    record();
    return forward(batch.data);
  }
  void record() {
    inference.push_back(c10::InferenceMode::is_enabled());
    grad.push_back(torch::GradMode::is_enabled());
  }
  std::vector<bool> inference, grad;
};

// A parameter whose loss is finite (2) and whose backward is NaN: where() takes 0 where w < 0,
// but sqrt's gradient there is 0 * 1/(2 sqrt(-1)).
struct NanInBackward : TrainingModule {
  NanInBackward() { w = register_parameter("w", torch::tensor({-1.0f, 4.0f})); }
  torch::Tensor training_step(Batch&, int64_t) override {
    return torch::where(w < 0, torch::zeros_like(w), torch::sqrt(w)).sum();
  }
  OptimizerConfig configure_optimizers() override {
    return std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.1));
  }
  torch::Tensor w;
};

// A step with an operation that has no deterministic kernel in LibTorch: put_ without
// accumulate (which of two writes to one place wins is not fixed).
struct Puts : testing::Regressor {
  torch::Tensor training_step(Batch& batch, int64_t batch_idx) override {
    auto flat = torch::zeros({batch.data.numel()});
    flat.put_(torch::arange(flat.numel()), batch.data.reshape({-1}), /*accumulate=*/false);
    batch.data = flat.view_as(batch.data);
    return Regressor::training_step(batch, batch_idx);
  }
};

template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return message_of(e);
  }
  return "";
}

}  // namespace trainer_lightning_flags_test

namespace {

using namespace trainer_lightning_flags_test;

// --overfit-batches 2 of 8 shuffled batches: every epoch trains on the same first 16 examples in
// order, and validation on the first 2 of its own batches, as Lightning 2.6 (which keeps the
// validation loader: "training and validation use different sets of data"). The loss on them
// falls: what the flag is for.
TEST(TrainerOverfitBatches, EveryEpochTrainsOnTheSameFirstBatchesInOrderAndValidatesOnAsMany) {
  torch::set_num_threads(1);
  for (const BatchLimit limit : {BatchLimit(2), BatchLimit(0.25)}) {
    testing::TempDir dir("lockstep_overfit");
    Trainer trainer(testing::quiet_options(dir).max_epochs(20).overfit_batches(limit));
    EXPECT_EQ(trainer.options().limit_train_batches(), limit);
    EXPECT_EQ(trainer.options().limit_val_batches(), limit);
    auto model = std::make_shared<IndexRecorder>();
    auto train = std::make_shared<DataLoader>(indexed_data(64), DataLoaderOptions(8).shuffle(true));
    auto val = std::make_shared<DataLoader>(indexed_data(64), DataLoaderOptions(8).shuffle(true));
    ::testing::internal::CaptureStderr();
    trainer.fit(model, train, val);
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(trainer.num_training_batches(), 2);
    EXPECT_EQ(trainer.num_val_batches(), 2);
    ASSERT_EQ(model->train.size(), 20u);
    for (const auto& epoch : model->train) EXPECT_EQ(epoch, first(16));
    ASSERT_EQ(model->val.size(), 20u);
    for (const auto& validation : model->val) EXPECT_EQ(validation, first(16));
    EXPECT_LT(model->epoch_loss.back(), 0.2 * model->epoch_loss.front())
        << "first epoch " << model->epoch_loss.front() << ", last " << model->epoch_loss.back();
    EXPECT_NE(err.find("--overfit-batches " + limit.str() + ": the training loader shuffles; it is read in order"),
              std::string::npos) << err;
    EXPECT_NE(err.find("the validation loader shuffles"), std::string::npos) << err;
  }
}

// Without the flag the same shuffled loader gives each epoch another order: the test above
// measures the flag, not the loader.
TEST(TrainerOverfitBatches, WithoutItTheShuffledLoaderChangesTheOrder) {
  testing::TempDir dir("lockstep_overfit_off");
  Trainer trainer(testing::quiet_options(dir).max_epochs(2).limit_train_batches(2));
  auto model = std::make_shared<IndexRecorder>();
  trainer.fit(model, std::make_shared<DataLoader>(indexed_data(64), DataLoaderOptions(8).shuffle(true)));
  ASSERT_EQ(model->train.size(), 2u);
  EXPECT_NE(model->train[0], first(16));
  EXPECT_NE(model->train[0], model->train[1]);
}

// The sanity check runs at most --limit-val-batches batches; -1 (Lightning's) runs that many.
TEST(TrainerSanityCheck, MinusOneRunsAsManyBatchesAsTheValidationLimit) {
  struct CountSanity : testing::Regressor {
    void validation_step(Batch& batch, int64_t batch_idx) override {
      if (trainer()->sanity_checking()) ++sanity;
      Regressor::validation_step(batch, batch_idx);
    }
    int64_t sanity = 0;
  };
  for (const auto& [asked, limit, ran] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {-1, 3, 3}, {-1, 9, 4}, {2, 9, 2}, {5, 3, 3}, {0, 9, 0}}) {
    testing::TempDir dir("lockstep_sanity");
    Trainer trainer(testing::quiet_options(dir).max_epochs(1).num_sanity_val_steps(asked).limit_val_batches(limit));
    auto model = std::make_shared<CountSanity>();
    trainer.fit(model, loader_of(testing::regression_data(16), 8), loader_of(testing::regression_data(32, 8, 9), 8));
    EXPECT_EQ(model->sanity, ran) << "--num-sanity-val-steps " << asked << " --limit-val-batches " << limit;
  }
}

// Lightning's default, inference_mode=True: validation, test and predict run under InferenceMode;
// false runs them under no_grad, whose outputs can take part in autograd later. The metrics are
// the same bits either way.
TEST(TrainerInferenceMode, EvaluationRunsUnderInferenceModeByDefaultAndUnderNoGradWithFalse) {
  std::map<bool, double> val_loss;
  for (const bool inference : {true, false}) {
    testing::TempDir dir("lockstep_inference_mode");
    Trainer trainer(testing::quiet_options(dir).max_epochs(2).inference_mode(inference));
    torch::manual_seed(3);
    auto model = std::make_shared<ModeRecorder>();
    auto val = loader_of(testing::regression_data(16, 8, 9), 8);
    trainer.fit(model, loader_of(testing::regression_data(32), 8), val);
    val_loss[inference] = trainer.validate(model, val).at("val_loss");
    trainer.test(model, val);
    const auto outputs = trainer.predict(model, val);
    ASSERT_EQ(model->inference.size(), 2u * 2 + 2 + 2 + 2) << "2 validations in fit, validate, test, predict";
    for (size_t i = 0; i < model->inference.size(); ++i) {
      EXPECT_EQ(model->inference[i], inference) << "step " << i;
      EXPECT_FALSE(model->grad[i]) << "step " << i;
    }
    ASSERT_EQ(outputs.size(), 2u);
    EXPECT_EQ(outputs[0].is_inference(), inference);
    EXPECT_TRUE(torch::GradMode::is_enabled()) << "the mode ends with the loop";
    EXPECT_FALSE(c10::InferenceMode::is_enabled());
    if (!inference) {  // a no_grad output is an ordinary tensor
      auto scale = torch::ones({1}, torch::requires_grad());
      (outputs[0] * scale).sum().backward();
      EXPECT_TRUE(scale.grad().defined());
    }
  }
  EXPECT_EQ(val_loss[true], val_loss[false]);
}

// Autograd's anomaly mode (Lightning's detect_anomaly): a backward that makes a NaN from a finite
// loss stops fit at once, naming the operation. Without it the NaN reaches the weight, and the
// run stops only at the next step's loss, naming no operation.
TEST(TrainerDetectAnomaly, ABackwardThatMakesANanNamesItsOperation) {
  auto data = loader_of(testing::regression_data(16), 8);
  testing::TempDir dir("lockstep_anomaly");
  auto on = std::make_shared<NanInBackward>();
  const std::string named = error_of([&] {
    ::testing::internal::CaptureStderr();
    Trainer(testing::quiet_options(dir).max_epochs(1).detect_anomaly(true)).fit(on, data);
    ::testing::internal::GetCapturedStderr();
  });
  EXPECT_NE(named.find("Function 'SqrtBackward0' returned nan values in its 0th output"), std::string::npos) << named;
  EXPECT_FALSE(torch::isnan(on->w).any().item<bool>()) << "stopped before the optimizer step";

  auto off = std::make_shared<NanInBackward>();
  const std::string later = error_of([&] { Trainer(testing::quiet_options(dir).max_epochs(1)).fit(off, data); });
  EXPECT_NE(later.find("got a nan loss in step 2"), std::string::npos) << later;
  EXPECT_NE(later.find("--detect-anomaly true"), std::string::npos) << later;
  EXPECT_EQ(later.find("SqrtBackward0"), std::string::npos) << later;
  EXPECT_TRUE(torch::isnan(off->w[0]).item<bool>());
}

// --deterministic true: LibTorch refuses an operation without a deterministic kernel (here
// put_) instead of running it, and sets cuBLAS's workspace for CUDA; false runs it.
TEST(TrainerDeterminism, DeterministicTrueRefusesAnOperationWithoutADeterministicKernel) {
  ::unsetenv("CUBLAS_WORKSPACE_CONFIG");
  auto data = loader_of(testing::regression_data(16), 8);
  testing::TempDir dir("lockstep_deterministic");
  Trainer free_run(testing::quiet_options(dir).max_epochs(1));
  free_run.fit(std::make_shared<Puts>(), data);
  EXPECT_EQ(free_run.global_step(), 2);
  EXPECT_FALSE(at::globalContext().deterministicAlgorithms());
  EXPECT_EQ(std::getenv("CUBLAS_WORKSPACE_CONFIG"), nullptr);

  Trainer strict(testing::quiet_options(dir).max_epochs(1).deterministic(true));
  const std::string error = error_of([&] { strict.fit(std::make_shared<Puts>(), data); });
  const bool on = at::globalContext().deterministicAlgorithms(), cudnn = at::globalContext().deterministicCuDNN();
  const char* workspace = std::getenv("CUBLAS_WORKSPACE_CONFIG");
  const std::string cublas = workspace == nullptr ? "(unset)" : workspace;
  at::globalContext().setDeterministicAlgorithms(false, false);  // the process's other tests
  at::globalContext().setDeterministicCuDNN(false);
  ::unsetenv("CUBLAS_WORKSPACE_CONFIG");
  EXPECT_NE(error.find("put_ does not have a deterministic implementation"), std::string::npos) << error;
  EXPECT_EQ(strict.global_step(), 0);
  EXPECT_TRUE(on);
  EXPECT_TRUE(cudnn);
  EXPECT_EQ(cublas, ":4096:8");
}

}  // namespace
}  // namespace lockstep
