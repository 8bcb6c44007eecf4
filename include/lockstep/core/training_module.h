#pragma once
/// TrainingModule: the LightningModule of Lockstep. A torch::nn::Module that also says how it
/// trains: its steps, its optimizers, what it logs.

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/schedulers/lr_scheduler.h>

#include <lockstep/core/batch.h>
#include <lockstep/core/log_options.h>
#include <lockstep/core/optimizer_config.h>
#include <lockstep/core/trainer_view.h>

namespace lockstep {

/// A model that knows how to train.
///
///   struct Classifier : lockstep::TrainingModule {
///     Classifier() { fc = register_module("fc", torch::nn::Linear(784, 10)); }
///     torch::Tensor training_step(lockstep::Batch& batch, int64_t) override {
///       auto loss = torch::nn::functional::cross_entropy(fc(batch.data), batch.target);
///       log("train_loss", loss, lockstep::LogOptions().prog_bar(true));
///       return loss;
///     }
///     lockstep::OptimizerConfig configure_optimizers() override {
///       return std::make_shared<torch::optim::Adam>(parameters(), 1e-3);
///     }
///     torch::nn::Linear fc{nullptr};
///   };
class TrainingModule : public torch::nn::Module {
 public:
  /// The loss of one batch (automatic optimisation), or an undefined tensor to skip the step.
  /// With manual optimisation, do the backward and steps here and return anything.
  virtual torch::Tensor training_step(Batch& batch, int64_t batch_idx) = 0;
  virtual void validation_step(Batch& batch, int64_t batch_idx) {}
  virtual void test_step(Batch& batch, int64_t batch_idx) {}
  /// Default: the module's output for batch.data is unknown to the base class, so override it.
  virtual torch::Tensor predict_step(Batch& batch, int64_t batch_idx);
  virtual OptimizerConfig configure_optimizers() = 0;

  // Lifecycle hooks, called on every rank.
  virtual void on_fit_start() {}
  virtual void on_fit_end() {}
  virtual void on_train_epoch_start() {}
  virtual void on_train_epoch_end() {}
  virtual void on_validation_epoch_start() {}
  virtual void on_validation_epoch_end() {}
  virtual void on_test_epoch_end() {}
  virtual void on_train_batch_end(const torch::Tensor& loss, Batch& batch, int64_t batch_idx) {}

  /// Moves a batch to the device the step runs on; override for batches of your own shape.
  virtual void transfer_batch_to_device(Batch& batch, const torch::Device& device) { to_device(batch, device); }

  /// Records a scalar metric; see LogOptions.
  void log(const std::string& name, const torch::Tensor& value, const LogOptions& options = {});
  void log(const std::string& name, double value, const LogOptions& options = {});

  /// Manual optimisation (GANs, several optimizers): call automatic_optimization(false) in the
  /// constructor, then in training_step use optimizers(), manual_backward(loss), opt->step().
  void automatic_optimization(bool enabled) { automatic_optimization_ = enabled; }
  bool automatic_optimization() const { return automatic_optimization_; }
  const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers() const;
  /// loss.backward() with the strategy's gradient synchronisation and precision handling.
  void manual_backward(const torch::Tensor& loss);

  /// The trainer running this module (null outside fit/validate/test/predict).
  TrainerView* trainer() const { return trainer_; }
  /// `tensor` of every rank, in rank order (a list of one outside a distributed run).
  std::vector<torch::Tensor> all_gather(const torch::Tensor& tensor);
  int64_t current_epoch() const;
  int64_t global_step() const;
  int global_rank() const;
  int world_size() const;
  /// The device steps run on.
  torch::Device device() const;

  /// Hyperparameters saved with checkpoints (`hyper_parameters`) and given to the loggers
  /// (hparams.yaml, TensorBoard's hparams) when fit starts, as Lightning's save_hyperparameters:
  /// a JSON object whose values keep their types (numbers, bools, strings, nested objects and
  /// lists). `hparams()["lr"] = 0.05;` or `hparams() = {{"lr", 0.05}, {"layers", {512, 256}}};`
  nlohmann::json& hparams() { return hparams_; }
  const nlohmann::json& hparams() const { return hparams_; }

 private:
  friend class TrainerView;  // attaches and detaches itself
  TrainerView* trainer_ = nullptr;
  bool automatic_optimization_ = true;
  nlohmann::json hparams_ = nlohmann::json::object();
};

}  // namespace lockstep
