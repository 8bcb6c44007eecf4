#include "replaced_child.h"

#include <memory>
#include <utility>

#include <torch/torch.h>

#include "activation_checkpoint.h"

namespace lockstep {
namespace distributed {
namespace detail {
namespace {

// A child unit's forward between the engine's gather and reshard.
class UnitForward : public torch::nn::Module {
 public:
  UnitForward(FullyShardedDataParallelBase* engine, size_t unit, torch::nn::AnyModule inner, bool checkpointed)
      : engine_(engine), unit_(unit), inner_(std::move(inner)), checkpointed_(checkpointed) {}
  at::Tensor forward(at::Tensor input) {
    engine_->before_unit_forward(unit_);
    // With a param_dtype the unit computes in it: its input cast there, its output back.
    const auto dtype = engine_->options().param_dtype();
    const bool cast = dtype && input.is_floating_point() && input.scalar_type() != *dtype;
    const auto in = cast ? input.to(*dtype) : input;
    auto output = checkpointed_ ? checkpointed_forward(inner_, in) : inner_.forward(in);
    if (cast && output.is_floating_point()) output = output.to(input.scalar_type());
    engine_->after_unit_forward(unit_, output);
    return output;
  }

 private:
  FullyShardedDataParallelBase* engine_;
  size_t unit_;
  torch::nn::AnyModule inner_;
  bool checkpointed_;
};

}  // namespace

ReplacedChild::ReplacedChild(FullyShardedDataParallelBase* engine, size_t unit, const ChildUnit& child)
    : parent_(child.parent), index_(child.index) {
  auto entry = parent_->begin() + static_cast<std::ptrdiff_t>(index_);
  original_ = *entry;
  *entry = torch::nn::AnyModule(std::make_shared<UnitForward>(engine, unit, original_, child.checkpointed));
}

ReplacedChild::~ReplacedChild() { *(parent_->begin() + static_cast<std::ptrdiff_t>(index_)) = original_; }

}  // namespace detail
}  // namespace distributed
}  // namespace lockstep
