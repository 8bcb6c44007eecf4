#pragma once
/// Parsing of `--accelerator` and `--devices` (the seed: Lightning's distrib_parts).
/// Every bad value is a lockstep::UsageError whose message names the fix.

#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include <lockstep/accelerators/device_busy_error.h>
#include <lockstep/core/error.h>
#include <lockstep/core/retry.h>

namespace lockstep {
namespace accelerators {

/// Where the model runs.
enum class Accelerator { cpu, cuda };
/// "cpu" or "cuda".
std::string to_string(Accelerator accelerator);

/// "auto" (cuda when LibTorch sees a GPU, else cpu), "cpu", "cuda" or "gpu" (both mean cuda).
/// `tpu`, `mps`, `ddp2`, `horovod`, `ipu`, `hpu` are Lightning names that do not apply to
/// LibTorch: the error says what to use instead. `cuda_device_count` is injected for tests.
Accelerator parse_accelerator(const std::string& spec, int cuda_device_count);

/// Number of CPU processes for `--devices` with the cpu accelerator: "auto" -> 1, "N" -> N (N>0).
int parse_cpu_devices(const std::string& spec);

/// GPU ids for `--devices` with the cuda accelerator, checked against the `visible` count
/// (CUDA_VISIBLE_DEVICES already applied): "auto" and "-1" -> all, "N" -> the first N,
/// "0,2" or "[0, 1]" -> those ids. "0" or "[]" is an error: the cuda accelerator needs a device.
std::vector<int> parse_gpu_ids(const std::string& spec, int visible);

/// Number of processes per node that `devices` means for `accelerator` (cpu or cuda).
int devices_per_node(Accelerator accelerator, const std::string& spec, int cuda_device_count);

/// With auto_select_gpus, the GPU ids the process that picked them hands to the processes it
/// launches ("1,3"), so that every rank of the node uses the same devices without probing again.
constexpr const char* kSelectedGpusVariable = "LOCKSTEP_SELECTED_GPUS";

/// Number of CUDA devices this LibTorch sees (0 on a CPU-only build). First sets
/// CUDA_DEVICE_ORDER=PCI_BUS_ID unless it is set (Lightning's set_nvidia_flags), so that device
/// ids, CUDA_VISIBLE_DEVICES and nvidia-smi number the GPUs alike; the processes Lockstep starts
/// inherit it. It acts only before the process's first CUDA call.
int cuda_device_count();

/// Says whether CUDA device `id` can be used now: false when it is busy (a GPU in exclusive
/// compute mode held by another process, or out of memory) or unusable.
using DeviceProbe = std::function<bool(int id)>;

/// The real probe (seed: `torch.ones(1).to(device)`): allocates one element on cuda:`id`, false
/// on any error. Always false on a CPU-only LibTorch. It leaves a CUDA context on every device it
/// probes, as the seed's did.
bool probe_cuda_device(int id);

/// The `count` lowest ids among 0..visible-1 that `probe` accepts, each probed at most once
/// (seed: pick_multiple_gpus). Throws DeviceBusyError, naming the busy ids, when fewer are free.
std::vector<int> pick_free_gpus(int count, int visible, const DeviceProbe& probe);

/// GPU ids for `--devices spec --auto-select-gpus`: a count ("N", "-1" or "auto" for every
/// visible device) is filled with free devices found by `probe`, retried with
/// retry_jittered_backoff (5 tries, waits of at most 0.01 s doubling up to 1 s by default); ids
/// given explicitly ("0,2") are used as given, as in Lightning. A UsageError naming the busy
/// devices when too few are free after the last try.
///   select_gpu_ids("2", cuda_device_count(), probe_cuda_device);   // e.g. {1, 3}
std::vector<int> select_gpu_ids(const std::string& spec, int visible, const DeviceProbe& probe,
                                const BackoffOptions& backoff = {});

}  // namespace accelerators
}  // namespace lockstep
