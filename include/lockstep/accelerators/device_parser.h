#pragma once
/// Parsing of `--accelerator` and `--devices` (the seed: Lightning's distrib_parts).
/// Every bad value is a lockstep::UsageError whose message names the fix.

#include <string>
#include <vector>

namespace lockstep {
namespace accelerators {

/// "auto" (cuda when LibTorch sees a GPU, else cpu), "cpu", "cuda" or "gpu" (both mean cuda).
/// `tpu`, `mps`, `ddp2`, `horovod`, `ipu`, `hpu` are Lightning names that do not apply to
/// LibTorch: the error says what to use instead. `cuda_device_count` is injected for tests.
std::string parse_accelerator(const std::string& spec, int cuda_device_count);

/// Number of CPU processes for `--devices` with the cpu accelerator: "auto" -> 1, "N" -> N (N>0).
int parse_cpu_devices(const std::string& spec);

/// GPU ids for `--devices` with the cuda accelerator, checked against the `visible` count
/// (CUDA_VISIBLE_DEVICES already applied): "auto" and "-1" -> all, "N" -> the first N,
/// "0,2" or "[0, 1]" -> those ids. "0" or "[]" is an error: the cuda accelerator needs a device.
std::vector<int> parse_gpu_ids(const std::string& spec, int visible);

/// Number of processes per node that `devices` means for `accelerator` (cpu or cuda).
int devices_per_node(const std::string& accelerator, const std::string& spec, int cuda_device_count);

/// Number of CUDA devices this LibTorch sees (0 on a CPU-only build).
int cuda_device_count();

}  // namespace accelerators
}  // namespace lockstep
