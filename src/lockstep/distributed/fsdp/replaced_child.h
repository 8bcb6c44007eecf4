#pragma once
// ReplacedChild: a child unit's place in its Sequential, taken by a forward that runs the engine's
// gather before it and reshard after it; the child goes back on destruction (not installed).

#include <cstddef>

#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>

#include <lockstep/distributed/fsdp/fully_sharded.h>

#include "wrap_policy.h"

namespace lockstep {
namespace distributed {
namespace detail {

class ReplacedChild {
 public:
  /// `child` becomes unit `unit` of `engine`. The child itself stays registered, so parameter
  /// names do not change.
  ReplacedChild(FullyShardedDataParallelBase* engine, size_t unit, const ChildUnit& child);
  ~ReplacedChild();
  ReplacedChild(const ReplacedChild&) = delete;
  ReplacedChild& operator=(const ReplacedChild&) = delete;

 private:
  torch::nn::SequentialImpl* parent_;
  size_t index_;
  torch::nn::AnyModule original_;
};

}  // namespace detail
}  // namespace distributed
}  // namespace lockstep
