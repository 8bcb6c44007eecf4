#pragma once
/// Precision: how the Trainer runs a step's numbers (Lightning's precision plugins), chosen once
/// from --precision when the plan is resolved: 32-true, 64-true, bf16-mixed (CPU autocast).

#include <string>

#include <c10/core/ScalarType.h>
#include <torch/nn/module.h>

#include <lockstep/accelerators/device_parser.h>
#include <lockstep/core/batch.h>

namespace lockstep {

class Precision {
 public:
  enum class Kind { true_32, true_64, bf16_mixed };

  /// "32", "32-true" -> 32-true; "64" -> 64-true; "bf16", "bf16-mixed" -> bf16-mixed. A
  /// UsageError for unknown names and for what `accelerator` cannot run yet
  /// (16-mixed anywhere, mixed precision on CUDA): refused, never float32 under another name.
  static Precision parse(const std::string& name, accelerators::Accelerator accelerator);

  Precision() = default;  // 32-true
  Kind kind() const { return kind_; }
  /// The normalised name: "32-true", "64-true" or "bf16-mixed".
  std::string name() const;

  /// float64 parameters and buffers for 64-true; nothing otherwise.
  void convert_module(torch::nn::Module& module) const;
  /// float64 floating inputs and targets for 64-true; nothing otherwise.
  void convert_batch(Batch& batch) const;

  /// Autocast to bfloat16 on the CPU while it lives, for bf16-mixed; inert otherwise.
  class StepScope {
   public:
    explicit StepScope(const Precision& precision);
    ~StepScope();
    StepScope(const StepScope&) = delete;
    StepScope& operator=(const StepScope&) = delete;

   private:
    bool active_;
    c10::ScalarType previous_dtype_ = c10::kBFloat16;
  };

 private:
  explicit Precision(Kind kind) : kind_(kind) {}
  Kind kind_ = Kind::true_32;
};

}  // namespace lockstep
