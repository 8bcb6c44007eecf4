#pragma once
/// The one place that knows which LibTorch this build compiles against (Debian's 1.13 or a 2.x
/// wheel): every difference between the two lines that Lockstep's code meets is answered here,
/// so no other file tests TORCH_VERSION_* (tests/architecture_test.cpp holds that). Mind both
/// lines when changing a branch: only one of them compiles on a given machine.

#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

#include <ATen/autocast_mode.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/version.h>

namespace c10d {
class ProcessGroup;
class Backend;
}  // namespace c10d

namespace lockstep {
namespace libtorch {

/// What runs the collectives of a group: LibTorch 1.x's c10d::ProcessGroup, 2.x's c10d::Backend
/// (ProcessGroupGloo and ProcessGroupNCCL derive from it). Both have the same collective calls
/// (allreduce, broadcast, allgather, barrier, ...) returning a c10d::Work.
#if TORCH_VERSION_MAJOR >= 2
using Backend = c10d::Backend;
#else
using Backend = c10d::ProcessGroup;
#endif

/// The variable that turns on NCCL's asynchronous error handling, under the name this build's
/// LibTorch reads and its torchrun sets: NCCL_ASYNC_ERROR_HANDLING up to torch 2.1,
/// TORCH_NCCL_ASYNC_ERROR_HANDLING from 2.2.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 2)
constexpr const char* kNcclAsyncErrorHandling = "TORCH_NCCL_ASYNC_ERROR_HANDLING";
#else
constexpr const char* kNcclAsyncErrorHandling = "NCCL_ASYNC_ERROR_HANDLING";
#endif

/// Whether this build's TCPStore client speaks the protocol of PyTorch 2.x's store servers, which
/// answer nothing until a client's first request is their validation: LibTorch 1.x's does not.
constexpr bool kSpeaksTorch2StoreProtocol = TORCH_VERSION_MAJOR >= 2;

/// A parameter's gradient accumulator, as torch::autograd::impl::grad_accumulator returns it:
/// std::shared_ptr in LibTorch 1.x, c10::intrusive_ptr in 2.x. Holding one keeps every forward's
/// graph reaching the same node (DDP's and FSDP's gradient hooks sit on it).
using GradAccumulator = decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()));
/// Makes `accumulator` `parameter`'s gradient accumulator again (set_data to another dtype lets
/// go of it). The tensor's autograd metadata holds it weakly: std::weak_ptr in LibTorch 1.x,
/// c10::weak_intrusive_ptr in 2.x.
inline void restore_grad_accumulator(const at::Tensor& parameter, const GradAccumulator& accumulator) {
  auto* meta = torch::autograd::impl::get_autograd_meta(parameter);
  meta->grad_accumulator_ = decltype(meta->grad_accumulator_)(accumulator);
}

/// The key of a parameter's state in `Optimizer::state()` (torch::optim::Optimizer): the
/// TensorImpl's address printed as a std::string in LibTorch 1.x, the pointer itself in 2.x.
/// Templates, so that this header need not include the optimizers.
template <typename Optimizer>
using OptimizerStateKey = typename std::decay_t<decltype(std::declval<Optimizer&>().state())>::key_type;
/// `param`'s key in `Optimizer::state()`.
template <typename Optimizer>
OptimizerStateKey<Optimizer> optimizer_state_key(const at::Tensor& param) {
  if constexpr (std::is_same_v<OptimizerStateKey<Optimizer>, std::string>) {
    std::ostringstream address;
    address << param.unsafeGetTensorImpl();
    return address.str();
  } else {
    return param.unsafeGetTensorImpl();
  }
}

// Autocast's state per device type. LibTorch 2.4 replaced the per-device functions
// (set_cpu_enabled, set_autocast_gpu_dtype, ...) with ones that take the device type.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
/// Whether autocast is on for device type `d` (kCPU or kCUDA).
inline bool autocast_enabled(c10::DeviceType d) { return at::autocast::is_autocast_enabled(d); }
/// The dtype autocast computes in on device type `d`.
inline c10::ScalarType autocast_dtype(c10::DeviceType d) { return at::autocast::get_autocast_dtype(d); }
/// Turns autocast on or off for device type `d`, computing in `dtype`.
inline void set_autocast(c10::DeviceType d, bool enabled, c10::ScalarType dtype) {
  at::autocast::set_autocast_enabled(d, enabled);
  at::autocast::set_autocast_dtype(d, dtype);
}
#else
/// Whether autocast is on for device type `d` (kCPU or kCUDA).
inline bool autocast_enabled(c10::DeviceType d) {
  return d == c10::kCUDA ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
}
/// The dtype autocast computes in on device type `d`.
inline c10::ScalarType autocast_dtype(c10::DeviceType d) {
  return d == c10::kCUDA ? at::autocast::get_autocast_gpu_dtype() : at::autocast::get_autocast_cpu_dtype();
}
/// Turns autocast on or off for device type `d`, computing in `dtype`.
inline void set_autocast(c10::DeviceType d, bool enabled, c10::ScalarType dtype) {
  if (d == c10::kCUDA) {
    at::autocast::set_enabled(enabled);
    at::autocast::set_autocast_gpu_dtype(dtype);
  } else {
    at::autocast::set_cpu_enabled(enabled);
    at::autocast::set_autocast_cpu_dtype(dtype);
  }
}
#endif

/// An allocator that hands out another's memory (`wrapped`) and does something more: it
/// implements allocate_over(). c10::Allocator::allocate is const up to LibTorch 2.2 and not from
/// 2.3, which also added the pure virtual copy_data.
class AllocatorOver : public c10::Allocator {
 public:
  explicit AllocatorOver(c10::Allocator* wrapped) : wrapped_(wrapped) {}
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
  c10::DataPtr allocate(size_t bytes) override { return allocate_over(bytes); }
  void copy_data(void* dest, const void* src, std::size_t count) const override { wrapped_->copy_data(dest, src, count); }
#else
  c10::DataPtr allocate(size_t bytes) const override { return allocate_over(bytes); }
#endif
  c10::DeleterFnPtr raw_deleter() const override { return wrapped_->raw_deleter(); }

 protected:
  virtual c10::DataPtr allocate_over(size_t bytes) const = 0;
  c10::Allocator* wrapped() const { return wrapped_; }

 private:
  c10::Allocator* wrapped_;
};

}  // namespace libtorch
}  // namespace lockstep
