#include <lockstep/core/training_module.h>

#include <torch/torch.h>

#include <lockstep/core/error.h>

namespace lockstep {
namespace {

TrainerView& require_trainer(TrainerView* trainer, const char* what) {
  if (trainer == nullptr) {
    throw UsageError(std::string(what) + " was called outside a Trainer run: call it from a step or hook "
                     "while trainer.fit/validate/test runs.");
  }
  return *trainer;
}

}  // namespace

void TrainerView::attach(TrainingModule& module, TrainerView* trainer) { module.trainer_ = trainer; }

torch::Tensor TrainingModule::predict_step(Batch& batch, int64_t batch_idx) {
  throw UsageError("Trainer::predict needs TrainingModule::predict_step: override it to return the "
                   "module's output for batch.data.");
}

void TrainingModule::log(const std::string& name, const torch::Tensor& value, const LogOptions& options) {
  if (value.numel() != 1) {
    throw UsageError("log('" + name + "') got a tensor of " + std::to_string(value.numel()) +
                     " elements; log scalars (e.g. loss.mean()).");
  }
  log(name, value.detach().to(torch::kCPU).to(torch::kFloat64).item<double>(), options);
}

void TrainingModule::log(const std::string& name, double value, const LogOptions& options) {
  if (trainer_ == nullptr) return;  // outside a run, as Lightning: nothing to log to
  trainer_->log(name, value, options);
}

const std::vector<std::shared_ptr<torch::optim::Optimizer>>& TrainingModule::optimizers() const {
  return require_trainer(trainer_, "optimizers()").optimizers();
}

void TrainingModule::manual_backward(const torch::Tensor& loss) {
  require_trainer(trainer_, "manual_backward()").manual_backward(loss);
}

int64_t TrainingModule::current_epoch() const { return trainer_ ? trainer_->current_epoch() : 0; }
int64_t TrainingModule::global_step() const { return trainer_ ? trainer_->global_step() : 0; }
int TrainingModule::global_rank() const { return trainer_ ? trainer_->global_rank() : 0; }
int TrainingModule::world_size() const { return trainer_ ? trainer_->world_size() : 1; }
torch::Device TrainingModule::device() const { return trainer_ ? trainer_->root_device() : torch::Device(torch::kCPU); }

std::vector<torch::Tensor> TrainingModule::all_gather(const torch::Tensor& tensor) {
  return trainer_ ? trainer_->all_gather(tensor) : std::vector<torch::Tensor>{tensor};
}

}  // namespace lockstep
