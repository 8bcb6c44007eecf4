#pragma once
/// FabricOptions: what a Fabric is configured by. These are the Trainer options that decide where
/// and how processes run, with the same names, defaults and checks (see trainer_options.h); as
/// flags, cli::add_fabric_flags adds them.

#include <string>

#include <torch/arg.h>

namespace lockstep {

///   Fabric fabric(FabricOptions().devices("2").strategy("ddp"));
struct FabricOptions {
  /// auto|cpu|cuda|gpu. Default: "auto" (cuda if LibTorch sees one, else cpu).
  TORCH_ARG(std::string, accelerator) = "auto";
  /// auto, a count N, -1 (all GPUs), or GPU ids "0,2". On CPU, N processes. Default: "auto".
  TORCH_ARG(std::string, devices) = "auto";
  /// auto|single_device|ddp|ddp_fork|ddp_separate|... (the registered names). Default: "auto".
  TORCH_ARG(std::string, strategy) = "auto";
  /// Nodes in the job. Default: 1.
  TORCH_ARG(int, num_nodes) = 1;
  /// 32-true|64-true|bf16-mixed|16-mixed. Default: "32-true".
  TORCH_ARG(std::string, precision) = "32-true";
  /// gloo|nccl|mpi; "" picks gloo on cpu, nccl on cuda. Default: "".
  TORCH_ARG(std::string, process_group_backend) = "";
  /// Seconds any collective may block before it fails, naming itself. Default: 1800.
  TORCH_ARG(double, timeout) = 1800.0;
};

}  // namespace lockstep
