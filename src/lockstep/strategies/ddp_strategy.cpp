#include <lockstep/strategies/ddp_strategy.h>

#include <lockstep/core/error.h>
#include <lockstep/core/training_module.h>
#include <lockstep/distributed/ddp/sync_batchnorm.h>
#include <lockstep/strategies/registry.h>

namespace lockstep {
namespace strategies {
namespace {

const bool ddp_registered = [] {
  using distributed::DDPOptions;
  register_strategy("ddp", [] { return std::make_shared<DDPStrategy>(); },
                    "one process per device; re-executes the program for the other local ranks");
  register_strategy("ddp_fork", [] { return std::make_shared<DDPStrategy>(DDPOptions(), "fork", "ddp_fork"); },
                    "ddp, forking instead of re-executing");
  register_strategy("ddp_find_unused_parameters_true",
                    [] {
                      return std::make_shared<DDPStrategy>(DDPOptions().find_unused_parameters(true), "popen",
                                                           "ddp_find_unused_parameters_true");
                    },
                    "ddp for models whose forward skips parameters");
  register_strategy("ddp_find_unused_parameters_false",
                    [] {
                      return std::make_shared<DDPStrategy>(DDPOptions().find_unused_parameters(false), "popen",
                                                           "ddp_find_unused_parameters_false");
                    },
                    "ddp (every parameter gets a gradient every step)");
  return true;
}();

// Fabric's view of one DistributedDataParallel.
class DDPModule : public WrappedModule {
 public:
  explicit DDPModule(std::shared_ptr<distributed::DistributedDataParallelBase> ddp) : ddp_(std::move(ddp)) {}
  void before_forward() override { ddp_->prepare_forward(); }
  void after_forward(const std::vector<at::Tensor>& outputs, bool known) override {
    ddp_->finish_forward_tensors(outputs, known);
  }
  bool gradient_sync() const override { return ddp_->require_backward_grad_sync(); }
  void set_gradient_sync(bool enabled) override { ddp_->set_require_backward_grad_sync(enabled); }

 private:
  std::shared_ptr<distributed::DistributedDataParallelBase> ddp_;
};

}  // namespace

DDPStrategy::DDPStrategy(distributed::DDPOptions options, std::string start_method, std::string name)
    : ParallelStrategy(std::move(start_method), std::move(name)), ddp_options_(std::move(options)) {}

std::shared_ptr<distributed::DistributedDataParallelBase> DDPStrategy::configure_ddp(
    const std::shared_ptr<torch::nn::Module>& module, const std::vector<int>& device_ids) {
  check_on_device(*module, device_ids);
  return std::make_shared<distributed::DistributedDataParallelBase>(module, process_group(), ddp_options_);
}

void DDPStrategy::convert_sync_batchnorm(const std::shared_ptr<torch::nn::Module>& module) {
  if (!context_.sync_batchnorm) return;
  distributed::convert_sync_batchnorm(module, process_group());
  const auto held = distributed::detail::replaced_batchnorms_still_held(*module);
  if (held.empty()) return;
  std::string names;
  for (const auto& n : held) names += (names.empty() ? "'" : ", '") + n + "'";
  throw UsageError("--sync-batchnorm true cannot convert the BatchNorm layer(s) " + names +
                   ": the model also holds them in typed members (such as `torch::nn::BatchNorm2d bn;`), which "
                   "keep calling the original layer, so their statistics would not be synchronised. Declare those "
                   "members as lockstep::distributed::SyncBatchNorm (plain BatchNorm on one process), or run "
                   "without --sync-batchnorm.");
}

std::shared_ptr<WrappedModule> DDPStrategy::setup_module(const std::shared_ptr<torch::nn::Module>& module) {
  convert_sync_batchnorm(module);
  ddp_ = configure_ddp(module, device_ids());
  return std::make_shared<DDPModule>(ddp_);
}

void DDPStrategy::teardown() { ddp_.reset(); }

torch::Tensor DDPStrategy::training_step(TrainingModule& module, Batch& batch, int64_t batch_idx) {
  // Before the forward, also with manual optimisation: backward may need the broadcast buffers
  // unchanged (batch norm saves them).
  ddp_->prepare_forward();
  if (!module.automatic_optimization()) {
    // The step calls the module's parts itself, unseen: a plain loss.backward() reduces too.
    ddp_->sync_every_backward();
    return module.training_step(batch, batch_idx);
  }
  torch::Tensor loss = module.training_step(batch, batch_idx);
  if (loss.defined()) ddp_->finish_forward(loss);
  return loss;
}

void DDPStrategy::manual_backward(const torch::Tensor& loss) {
  // A manual step computes its outputs outside the wrapper; arm the reduction from the loss.
  ddp_->finish_forward(loss);
  try {
    loss.backward();
  } catch (const distributed::UnusedParametersError& e) {
    // The usual cause here: parts of the model trained in alternation (a GAN).
    throw distributed::UnusedParametersError(
        message_of(e) + " If parts of the model are updated in alternation (a GAN's generator and "
                                "discriminator), use --strategy ddp_separate: one DistributedDataParallel per "
                                "child module.",
        e.parameter_names());
  }
}

void DDPStrategy::set_gradient_sync(bool enabled) {
  if (ddp_) ddp_->set_require_backward_grad_sync(enabled);
}

}  // namespace strategies
}  // namespace lockstep
