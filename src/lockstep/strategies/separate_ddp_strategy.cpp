#include <lockstep/strategies/separate_ddp_strategy.h>

#include <lockstep/core/training_module.h>
#include <lockstep/distributed/ddp/sync_batchnorm.h>
#include <lockstep/strategies/registry.h>

namespace lockstep {
namespace strategies {
namespace {

const bool ddp_separate_registered = register_strategy(
    "ddp_separate", [] { return std::make_shared<SeparateDDPStrategy>(); },
    "ddp with one DistributedDataParallel per child module (GANs: generator and discriminator)");

// Fabric's view of one SeparateDDP: a forward through the whole module arms the children its
// outputs reach.
class SeparateModule : public WrappedModule {
 public:
  explicit SeparateModule(std::shared_ptr<distributed::SeparateDDP> separate) : separate_(std::move(separate)) {}
  void before_forward() override { separate_->prepare_forward(); }
  void after_forward(const std::vector<at::Tensor>& outputs, bool known) override {
    if (known) {
      separate_->arm_for_backward(outputs);
    } else {
      separate_->sync_every_backward();
    }
  }
  bool gradient_sync() const override { return separate_->require_backward_grad_sync(); }
  void set_gradient_sync(bool enabled) override { separate_->set_require_backward_grad_sync(enabled); }

 private:
  std::shared_ptr<distributed::SeparateDDP> separate_;
};

}  // namespace

SeparateDDPStrategy::SeparateDDPStrategy(distributed::DDPOptions options, std::string start_method)
    : DDPStrategy(std::move(options), std::move(start_method), "ddp_separate") {}

std::shared_ptr<WrappedModule> SeparateDDPStrategy::setup_module(const std::shared_ptr<torch::nn::Module>& module) {
  convert_sync_batchnorm(module);
  std::vector<c10::Device> device_ids;
  if (context_.accelerator == accelerators::Accelerator::cuda) device_ids.push_back(root_device());
  separate_ = std::make_shared<distributed::SeparateDDP>(module, process_group(), ddp_options(), device_ids);
  all_.push_back(separate_);
  return std::make_shared<SeparateModule>(separate_);
}

void SeparateDDPStrategy::teardown() {
  separate_.reset();
  all_.clear();
  DDPStrategy::teardown();
}

torch::Tensor SeparateDDPStrategy::training_step(TrainingModule& module, Batch& batch, int64_t batch_idx) {
  // Before the forwards: with broadcast_buffers(true) backward may need the broadcast buffers
  // unchanged (batch norm).
  separate_->prepare_forward();
  // A manual step calls the children itself: a plain loss.backward() reduces those it reaches.
  if (!module.automatic_optimization()) separate_->sync_every_backward();
  return module.training_step(batch, batch_idx);
}

void SeparateDDPStrategy::backward(const torch::Tensor& loss) {
  for (const auto& separate : all_) separate->arm_for_backward(loss);
  loss.backward();
}

void SeparateDDPStrategy::manual_backward(const torch::Tensor& loss) { backward(loss); }

void SeparateDDPStrategy::set_gradient_sync(bool enabled) {
  for (const auto& separate : all_) separate->set_require_backward_grad_sync(enabled);
}

}  // namespace strategies
}  // namespace lockstep
