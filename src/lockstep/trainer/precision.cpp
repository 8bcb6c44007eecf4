#include <lockstep/trainer/precision.h>

#include <map>

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <lockstep/core/error.h>

namespace lockstep {

Precision Precision::parse(const std::string& name, accelerators::Accelerator accelerator) {
  using accelerators::Accelerator;
  static const std::map<std::string, std::string> aliases{
      {"32", "32-true"},       {"32-true", "32-true"}, {"64", "64-true"},       {"64-true", "64-true"},
      {"bf16", "bf16-mixed"},  {"bf16-mixed", "bf16-mixed"}, {"16", "16-mixed"}, {"16-mixed", "16-mixed"}};
  const auto it = aliases.find(name);
  if (it == aliases.end()) {
    throw UsageError("--precision '" + name + "' is unknown. Use 32-true, 64-true, bf16-mixed or 16-mixed.");
  }
  const std::string& normal = it->second;
  if (normal == "16-mixed" && accelerator != Accelerator::cuda) {
    throw UsageError("--precision " + name + " needs CUDA (float16 autocast); on CPU use --precision bf16-mixed "
                     "or 32-true.");
  }
  // Refused until CUDA autocast (and loss scaling for float16) exist.
  if (accelerator == Accelerator::cuda && (normal == "16-mixed" || normal == "bf16-mixed")) {
    throw UsageError("--precision " + name + " on CUDA is not implemented yet in Lockstep (CUDA autocast" +
                     std::string(normal == "16-mixed" ? " with dynamic loss scaling" : "") +
                     " comes with the LibTorch 2.x CUDA build). Use --precision 32-true on CUDA, or bf16-mixed "
                     "with --accelerator cpu.");
  }
  if (normal == "64-true") return Precision(Kind::true_64);
  if (normal == "bf16-mixed") return Precision(Kind::bf16_mixed);
  return Precision(Kind::true_32);
}

std::string Precision::name() const {
  switch (kind_) {
    case Kind::true_64: return "64-true";
    case Kind::bf16_mixed: return "bf16-mixed";
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

Precision::StepScope::StepScope(const Precision& precision) : active_(precision.kind() == Kind::bf16_mixed) {
  if (!active_) return;
  previous_dtype_ = at::autocast::get_autocast_cpu_dtype();
  at::autocast::set_cpu_enabled(true);
  at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
  at::autocast::increment_nesting();
}

Precision::StepScope::~StepScope() {
  if (!active_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_cpu_enabled(false);
  at::autocast::set_autocast_cpu_dtype(previous_dtype_);
}

}  // namespace lockstep
