#include <lockstep/plan/precision.h>

#include <map>

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <lockstep/core/error.h>
#include <lockstep/core/libtorch_compat.h>

namespace lockstep {
Precision Precision::parse(const std::string& name, accelerators::Accelerator accelerator) {
  using accelerators::Accelerator;
  static const std::map<std::string, Kind> kinds{
      {"32", Kind::true_32},          {"32-true", Kind::true_32},    {"64", Kind::true_64},
      {"64-true", Kind::true_64},     {"bf16", Kind::bf16_mixed},    {"bf16-mixed", Kind::bf16_mixed},
      {"16", Kind::f16_mixed},        {"16-mixed", Kind::f16_mixed}};
  const auto it = kinds.find(name);
  if (it == kinds.end()) {
    throw UsageError("--precision '" + name + "' is unknown. Use 32-true, 64-true, bf16-mixed or 16-mixed.");
  }
  const bool cuda = accelerator == Accelerator::cuda;
  if (it->second == Kind::f16_mixed && !cuda) {
    throw UsageError("--precision " + name + " needs CUDA (float16 autocast); on CPU use --precision bf16-mixed "
                     "or 32-true.");
  }
  return Precision(it->second, cuda ? c10::kCUDA : c10::kCPU);
}

std::string Precision::name() const {
  switch (kind_) {
    case Kind::true_64: return "64-true";
    case Kind::bf16_mixed: return "bf16-mixed";
    case Kind::f16_mixed: return "16-mixed";
    case Kind::true_32: break;
  }
  return "32-true";
}

void Precision::convert_module(torch::nn::Module& module) const {
  if (kind_ == Kind::true_64) module.to(torch::kFloat64);
}

void Precision::convert_batch(Batch& batch) const {
  if (kind_ != Kind::true_64) return;
  if (batch.data.defined() && batch.data.is_floating_point()) batch.data = batch.data.to(torch::kFloat64);
  if (batch.target.defined() && batch.target.is_floating_point()) batch.target = batch.target.to(torch::kFloat64);
}

Precision::StepScope::StepScope(const Precision& precision)
    : active_(precision.kind() == Kind::bf16_mixed || precision.kind() == Kind::f16_mixed),
      device_(precision.autocast_device()) {
  if (!active_) return;
  previous_enabled_ = libtorch::autocast_enabled(device_);
  previous_dtype_ = libtorch::autocast_dtype(device_);
  libtorch::set_autocast(device_, true, precision.kind() == Kind::f16_mixed ? c10::kHalf : c10::kBFloat16);
  at::autocast::increment_nesting();
}

Precision::StepScope::~StepScope() {
  if (!active_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  libtorch::set_autocast(device_, previous_enabled_, previous_dtype_);
}

}  // namespace lockstep
