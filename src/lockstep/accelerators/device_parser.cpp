#include <lockstep/accelerators/device_parser.h>

#include <stdlib.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <set>

#include <torch/cuda.h>
#include <torch/types.h>

#include <lockstep/core/error.h>

namespace lockstep {
namespace accelerators {
namespace {

std::string trim(const std::string& s) {
  const auto begin = s.find_first_not_of(" \t");
  if (begin == std::string::npos) return "";
  return s.substr(begin, s.find_last_not_of(" \t") - begin + 1);
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

bool parse_int(const std::string& text, int& out) {
  const std::string t = trim(text);
  if (t.empty()) return false;
  size_t used = 0;
  try {
    out = std::stoi(t, &used);
  } catch (const std::exception&) {
    return false;
  }
  return used == t.size();
}

// "0,2", "[0, 1]", "1," -> {0,2}, {0,1}, {1}; false if an element is not an integer.
bool parse_list(const std::string& spec, std::vector<int>& ids) {
  std::string body = trim(spec);
  if (!body.empty() && body.front() == '[') {
    if (body.back() != ']') return false;
    body = body.substr(1, body.size() - 2);
  }
  size_t start = 0;
  while (start <= body.size()) {
    const size_t comma = body.find(',', start);
    const std::string item = trim(body.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    int id = 0;
    if (!item.empty()) {
      if (!parse_int(item, id)) return false;
      ids.push_back(id);
    } else if (comma != std::string::npos && comma + 1 < body.size()) {
      return false;  // an empty element in the middle: "0,,1"
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return true;
}

// "auto", "-1" or "N": a number of devices rather than their ids.
bool is_device_count(const std::string& lowered) {
  int n = 0;
  return lowered == "auto" || (lowered.find_first_of(",[") == std::string::npos && parse_int(lowered, n));
}

std::string join(const std::vector<int>& ids) {
  std::string text;
  for (int id : ids) text += (text.empty() ? "" : ", ") + std::to_string(id);
  return text;
}

}  // namespace

std::string to_string(Accelerator accelerator) { return accelerator == Accelerator::cuda ? "cuda" : "cpu"; }

Accelerator parse_accelerator(const std::string& spec, int cuda_device_count) {
  static const std::map<std::string, std::string> not_for_libtorch{
      {"tpu", "TPUs need torch_xla, which has no C++ frontend"},
      {"mps", "Apple's MPS backend is not in Debian's LibTorch"},
      {"ipu", "IPUs need Graphcore's poptorch, a Python package"},
      {"hpu", "HPUs need Habana's Python bridge"},
      {"ddp2", "ddp2 was removed from Lightning 1.7; it is a strategy, not an accelerator"},
      {"ddp", "ddp is a strategy (Lightning 1.x took it as an accelerator)"},
      {"ddp_cpu", "ddp_cpu is a strategy on CPU processes (Lightning 1.x took it as an accelerator)"},
      {"ddp_spawn", "ddp_spawn is a strategy (Lightning 1.x took it as an accelerator)"},
      {"dp", "dp is a strategy (Lightning 1.x took it as an accelerator)"},
      {"horovod", "Horovod is a strategy, not an accelerator, and Lockstep uses c10d instead"},
  };
  const std::string name = lower(trim(spec));
  if (name == "auto") return cuda_device_count > 0 ? Accelerator::cuda : Accelerator::cpu;
  if (name == "cpu") return Accelerator::cpu;
  if (name == "cuda" || name == "gpu") {
    if (cuda_device_count == 0) {
      throw UsageError("--accelerator " + spec +
                       " needs CUDA, but this LibTorch sees no CUDA device (Debian's libtorch is a "
                       "CPU build). Use --accelerator cpu (or auto).");
    }
    return Accelerator::cuda;
  }
  const auto it = not_for_libtorch.find(name);
  if (it != not_for_libtorch.end()) {
    throw UsageError("--accelerator " + spec + " does not apply to LibTorch: " + it->second +
                     ". Use --accelerator cpu, cuda or auto" +
                     (name.rfind("ddp", 0) == 0 || name == "dp" || name == "horovod" ? " and --strategy ddp." : "."));
  }
  throw UsageError("--accelerator '" + spec + "' is unknown. Use auto, cpu, cuda or gpu.");
}

int parse_cpu_devices(const std::string& spec) {
  const std::string s = lower(trim(spec));
  if (s == "auto") return 1;
  int n = 0;
  if (!parse_int(s, n)) {
    throw UsageError("--devices '" + spec +
                     "' is not valid for the cpu accelerator: give the number of processes, e.g. "
                     "--devices 2 (device ids like \"0,1\" are for --accelerator cuda).");
  }
  if (n <= 0) {
    throw UsageError("--devices " + spec + " with the cpu accelerator: the number of processes must be "
                     "at least 1 (-1, 'all GPUs', has no meaning on CPU). Use e.g. --devices 2.");
  }
  return n;
}

std::vector<int> parse_gpu_ids(const std::string& spec, int visible) {
  const std::string s = lower(trim(spec));
  std::vector<int> ids;
  int n = 0;
  if (s == "auto" || s == "-1") {
    for (int i = 0; i < visible; ++i) ids.push_back(i);
  } else if (s.find_first_of(",[") == std::string::npos && parse_int(s, n)) {
    if (n < -1) throw UsageError("--devices " + spec + " is not a device count: use N >= 1, -1 (all) or ids like 0,1.");
    if (n > visible) {
      throw UsageError("--devices " + spec + " but only " + std::to_string(visible) +
                       " CUDA device(s) are visible (check CUDA_VISIBLE_DEVICES). Use --devices " +
                       std::to_string(visible) + " or -1.");
    }
    for (int i = 0; i < n; ++i) ids.push_back(i);
  } else if (!parse_list(s, ids)) {
    throw UsageError("--devices '" + spec + "' is not a device list: use a count (2), -1 (all), or ids (\"0,2\" or \"[0, 1]\").");
  }
  if (ids.empty()) {
    throw UsageError("--devices " + spec + " selects no device, but the cuda accelerator needs at least one. "
                     "Use --devices 1 (or -1 for all), or --accelerator cpu.");
  }
  std::set<int> seen;
  for (int id : ids) {
    if (id < 0 || id >= visible) {
      throw UsageError("--devices " + spec + " asks for CUDA device " + std::to_string(id) + " but only ids 0.." +
                       std::to_string(visible - 1) + " are visible (CUDA_VISIBLE_DEVICES is applied). Use ids below " +
                       std::to_string(visible) + ".");
    }
    if (!seen.insert(id).second) {
      throw UsageError("--devices " + spec + " names device " + std::to_string(id) + " twice; list each id once.");
    }
  }
  return ids;
}

int devices_per_node(Accelerator accelerator, const std::string& spec, int cuda_device_count) {
  if (accelerator == Accelerator::cuda) return static_cast<int>(parse_gpu_ids(spec, cuda_device_count).size());
  return parse_cpu_devices(spec);
}

int cuda_device_count() {
  // CUDA's own order is fastest first, which need not be nvidia-smi's; a user's value is kept.
  ::setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID", /*overwrite=*/0);
  return static_cast<int>(torch::cuda::device_count());
}

bool probe_cuda_device(int id) {
  try {
    torch::ones({1}, torch::TensorOptions().device(torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(id))));
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

std::vector<int> pick_free_gpus(int count, int visible, const DeviceProbe& probe) {
  if (count < 1 || count > visible) {
    throw UsageError("cannot pick " + std::to_string(count) + " of " + std::to_string(visible) +
                     " visible CUDA device(s); ask for 1 to " + std::to_string(visible) + ".");
  }
  std::vector<int> picked, busy;
  for (int id = 0; id < visible && static_cast<int>(picked.size()) < count; ++id) {
    (probe(id) ? picked : busy).push_back(id);
  }
  if (static_cast<int>(picked.size()) == count) return picked;
  throw DeviceBusyError(std::to_string(picked.size()) + " of the " + std::to_string(visible) +
                        " visible CUDA device(s) " + (picked.size() == 1 ? "is" : "are") + " free (busy or unusable: " +
                        join(busy) + "), " + std::to_string(count) + " needed");
}

std::vector<int> select_gpu_ids(const std::string& spec, int visible, const DeviceProbe& probe,
                                const BackoffOptions& backoff) {
  std::vector<int> ids = parse_gpu_ids(spec, visible);
  if (!is_device_count(lower(trim(spec)))) return ids;  // ids named by the user are not probed
  const int count = static_cast<int>(ids.size());
  try {
    return retry_jittered_backoff<DeviceBusyError>([&] { return pick_free_gpus(count, visible, probe); }, backoff);
  } catch (const DeviceBusyError& e) {
    throw UsageError("--devices " + spec + " --auto-select-gpus: " + message_of(e) + " after " +
                     std::to_string(backoff.retries()) + " tries. Ask for fewer devices (--devices N), " +
                     "free the busy ones, or name the ids to use (--devices 0,1; not probed).");
  }
}

}  // namespace accelerators
}  // namespace lockstep
