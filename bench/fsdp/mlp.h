#pragma once
// What bench_fsdp and bench_checkpoint share with bench/fsdp/fsdp_bench.py: the MLPs, the same
// initial weights on both sides, and the memory figures of /proc/self/status.
#include <chrono>
#include <fstream>
#include <string>
#include <vector>

#include <torch/torch.h>

#include <lockstep/distributed/collectives.h>

namespace bench {

// Linear widths, the same in fsdp_bench.py. "25m" is bench_ddp's 24.2M MLP; "100m" (103.9M) has
// seven hidden layers of 4096, so that no unit is more than a sixth of the model, as in a deep
// network; "100m-wide" (107.2M) puts two thirds of it in one 8192 x 8192 layer.
inline std::vector<int64_t> widths(const std::string& model) {
  if (model == "small") return {784, 512, 256, 10};  // bench_ddp's (bench_checkpoint_cost)
  if (model == "25m") return {784, 4096, 4096, 1024, 10};
  if (model == "100m") return {784, 4096, 4096, 4096, 4096, 4096, 4096, 4096, 10};
  return {784, 8192, 8192, 4096, 10};
}

// The MLP: Linear, ReLU, ..., Linear. Linears are created in forward order, as in fsdp_bench.py,
// so that both sides draw the same initial weights.
struct NetImpl : torch::nn::Module {
  explicit NetImpl(const std::string& model) {
    const auto w = widths(model);
    for (size_t i = 0; i + 1 < w.size(); ++i) {
      layers->push_back(torch::nn::Linear(w[i], w[i + 1]));
      if (i + 2 < w.size()) layers->push_back(torch::nn::ReLU());
    }
    register_module("layers", layers);
  }
  torch::Tensor forward(torch::Tensor x) { return layers->forward(x); }
  torch::nn::Sequential layers;
};

inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

inline double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// A field of /proc/self/status in MB ("VmRSS", "VmHWM", "RssShmem"), 0 where the kernel lacks it.
inline double status_mb(const std::string& field) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(field + ":", 0) == 0) return std::stod(line.substr(field.size() + 1)) / 1024.0;  // kB
  }
  return 0;
}

// Every rank's `value`, in rank order (a collective).
inline std::vector<double> per_rank(lockstep::distributed::ProcessGroup& group, double value) {
  auto all = torch::zeros({group.world_size()}, torch::kFloat64);
  all[group.rank()] = value;
  all = lockstep::distributed::all_reduce(group, all, lockstep::distributed::ReduceOp::sum);
  return std::vector<double>(all.data_ptr<double>(), all.data_ptr<double>() + all.numel());
}

}  // namespace bench
