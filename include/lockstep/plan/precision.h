#pragma once
/// Precision: how the Trainer and Fabric run a step's numbers (Lightning's precision plugins), chosen once
/// from --precision when the plan is resolved: 32-true, 64-true, bf16-mixed (CPU or CUDA
/// autocast) and 16-mixed (CUDA float16 autocast with dynamic loss scaling, see GradScaler).

#include <string>

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <torch/nn/module.h>

#include <lockstep/accelerators/device_parser.h>
#include <lockstep/core/batch.h>

namespace lockstep {

class Precision {
 public:
  enum class Kind { true_32, true_64, bf16_mixed, f16_mixed };

  /// "32", "32-true" -> 32-true; "64" -> 64-true; "bf16", "bf16-mixed" -> bf16-mixed;
  /// "16", "16-mixed" -> 16-mixed. A UsageError for unknown names and for 16-mixed off CUDA
  /// (float16 autocast is a CUDA feature; on the CPU use bf16-mixed), as in Lightning.
  static Precision parse(const std::string& name, accelerators::Accelerator accelerator);

  Precision() = default;  // 32-true
  Kind kind() const { return kind_; }
  /// The normalised name: "32-true", "64-true", "bf16-mixed" or "16-mixed".
  std::string name() const;
  /// The device type autocast runs on: CPU, or CUDA when the accelerator is cuda.
  c10::DeviceType autocast_device() const { return device_; }
  /// True for 16-mixed: the loss is scaled and unscales gradients (GradScaler).
  bool scales_loss() const { return kind_ == Kind::f16_mixed; }

  /// float64 parameters and buffers for 64-true; nothing otherwise.
  void convert_module(torch::nn::Module& module) const;
  /// float64 floating inputs and targets for 64-true; nothing otherwise.
  void convert_batch(Batch& batch) const;

  /// Autocast on the precision's device while it lives (bfloat16 for bf16-mixed, float16 for
  /// 16-mixed); inert otherwise. Restores the state it found.
  class [[nodiscard]] StepScope {
   public:
    explicit StepScope(const Precision& precision);
    ~StepScope();
    StepScope(const StepScope&) = delete;
    StepScope& operator=(const StepScope&) = delete;

   private:
    bool active_;
    c10::DeviceType device_;
    bool previous_enabled_ = false;
    c10::ScalarType previous_dtype_ = c10::kBFloat16;
  };

 private:
  Precision(Kind kind, c10::DeviceType device) : kind_(kind), device_(device) {}
  Kind kind_ = Kind::true_32;
  c10::DeviceType device_ = c10::kCPU;
};

}  // namespace lockstep
