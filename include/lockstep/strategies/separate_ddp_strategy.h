#pragma once
/// SeparateDDPStrategy (`--strategy ddp_separate`): DDP with one DistributedDataParallel per
/// child module of the TrainingModule, through SeparateDDP (seed: MMEditing's
/// DistributedDataParallelWrapper). For GANs trained with manual optimisation: a discriminator
/// step leaves the generator without gradients, which one DDP around the whole model rejects.

#include <memory>
#include <string>
#include <vector>

#include <lockstep/distributed/ddp/separate_ddp.h>
#include <lockstep/strategies/ddp_strategy.h>

namespace lockstep {
namespace strategies {

/// The module's children hold all its parameters (a generator and a discriminator, say); each
/// backward reduces the gradients of exactly the children its loss depends on. Buffers are not
/// broadcast (each rank keeps its own BatchNorm statistics, as MMEditing's wrapper) unless the
/// options set broadcast_buffers(true); other options leave that default. Steps call the
/// children directly, as in single-process code:
///
///   auto fake = generator(z);
///   auto d_loss = bce(discriminator(real), 1) + bce(discriminator(fake.detach()), 0);
///   opt_d->zero_grad(); manual_backward(d_loss); opt_d->step();   // reduces the discriminator only
class SeparateDDPStrategy : public DDPStrategy {
 public:
  explicit SeparateDDPStrategy(distributed::DDPOptions options = distributed::separate_ddp_options(),
                               std::string start_method = "popen");

  std::shared_ptr<WrappedModule> setup_module(const std::shared_ptr<torch::nn::Module>& module) override;
  void teardown() override;
  torch::Tensor training_step(TrainingModule& module, Batch& batch, int64_t batch_idx) override;
  /// Arms the children `loss` reaches, in every module set up (their forwards may have been
  /// called directly), then runs backward.
  void backward(const torch::Tensor& loss) override;
  void manual_backward(const torch::Tensor& loss) override;
  void set_gradient_sync(bool enabled) override;

  /// The per-child wrappers of the module set up last (null before setup_module).
  const std::shared_ptr<distributed::SeparateDDP>& separate_ddp() const { return separate_; }

 private:
  std::shared_ptr<distributed::SeparateDDP> separate_;
  std::vector<std::shared_ptr<distributed::SeparateDDP>> all_;  // one per module set up
};

}  // namespace strategies
}  // namespace lockstep
