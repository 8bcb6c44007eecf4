#include <lockstep/strategies/separate_ddp_strategy.h>

#include <lockstep/core/training_module.h>
#include <lockstep/distributed/sync_batchnorm.h>
#include <lockstep/strategies/registry.h>

namespace lockstep {
namespace strategies {
namespace {

const bool registered = register_strategy(
    "ddp_separate", [] { return std::make_shared<SeparateDDPStrategy>(); },
    "ddp with one DistributedDataParallel per child module (GANs: generator and discriminator)");

}  // namespace

SeparateDDPStrategy::SeparateDDPStrategy(distributed::DDPOptions options, std::string start_method)
    : DDPStrategy(std::move(options), std::move(start_method), "ddp_separate") {}

void SeparateDDPStrategy::setup_module(const std::shared_ptr<torch::nn::Module>& module) {
  convert_sync_batchnorm(module);
  std::vector<c10::Device> device_ids;
  if (context_.accelerator == accelerators::Accelerator::cuda) device_ids.push_back(root_device());
  separate_ = std::make_shared<distributed::SeparateDDP>(module, process_group(), ddp_options(), device_ids);
}

void SeparateDDPStrategy::teardown() {
  separate_.reset();
  DDPStrategy::teardown();
}

void SeparateDDPStrategy::prepare_forward() {
  if (separate_) separate_->prepare_forward();
}

torch::Tensor SeparateDDPStrategy::training_step(TrainingModule& module, Batch& batch, int64_t batch_idx) {
  // Buffers are broadcast before the forwards: backward may need them unchanged (batch norm).
  separate_->prepare_forward();
  torch::Tensor loss = module.training_step(batch, batch_idx);
  if (module.automatic_optimization() && loss.defined()) separate_->arm_for_backward(loss);
  return loss;
}

void SeparateDDPStrategy::manual_backward(const torch::Tensor& loss) {
  separate_->arm_for_backward(loss);
  loss.backward();
}

void SeparateDDPStrategy::set_gradient_sync(bool enabled) {
  if (separate_) separate_->set_require_backward_grad_sync(enabled);
}

}  // namespace strategies
}  // namespace lockstep
