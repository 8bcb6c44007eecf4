#include <lockstep/strategies/strategy.h>

#include <lockstep/core/training_module.h>

namespace lockstep {
namespace strategies {

torch::Tensor Strategy::training_step(TrainingModule& module, Batch& batch, int64_t batch_idx) {
  return module.training_step(batch, batch_idx);
}

torch::Device SingleDeviceStrategy::root_device() const {
  if (context_.accelerator == accelerators::Accelerator::cuda) {
    return torch::Device(torch::kCUDA, context_.gpu_ids.empty() ? 0 : static_cast<c10::DeviceIndex>(context_.gpu_ids[0]));
  }
  return torch::Device(torch::kCPU);
}

}  // namespace strategies
}  // namespace lockstep
