#include <lockstep/strategies/strategy.h>

#include <lockstep/core/training_module.h>
#include <lockstep/data/data_loader.h>
#include <lockstep/data/sampler.h>

namespace lockstep {
namespace strategies {

torch::Tensor Strategy::training_step(TrainingModule& module, Batch& batch, int64_t batch_idx) {
  return module.training_step(batch, batch_idx);
}

void add_distributed_sampler(const Strategy& strategy, DataLoader& loader, bool shuffle) {
  const auto kwargs = strategy.distributed_sampler_kwargs();
  if (!kwargs || loader.has_sampler()) return;
  loader.set_sampler(std::make_shared<distributed::DistributedSampler>(
      loader.dataset()->size(), distributed::SamplerOptions(kwargs->first, kwargs->second)
                                    .shuffle(shuffle)
                                    .seed(loader.options().seed())
                                    .drop_last(false)));
}

torch::Device SingleDeviceStrategy::root_device() const {
  if (context_.accelerator == accelerators::Accelerator::cuda) {
    return torch::Device(torch::kCUDA, context_.gpu_ids.empty() ? 0 : static_cast<c10::DeviceIndex>(context_.gpu_ids[0]));
  }
  return torch::Device(torch::kCPU);
}

}  // namespace strategies
}  // namespace lockstep
