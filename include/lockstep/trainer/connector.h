#pragma once
/// The connector (seed: Lightning's AcceleratorConnector): turns TrainerOptions and the process
/// environment into one plan, as a short ordered list of decisions. Bad or contradictory
/// settings are UsageErrors naming the fix.

#include <memory>
#include <string>
#include <vector>

#include <lockstep/accelerators/device_parser.h>
#include <lockstep/environments/cluster_environment.h>
#include <lockstep/strategies/strategy.h>
#include <lockstep/trainer/precision.h>
#include <lockstep/trainer/trainer_options.h>

namespace lockstep {

/// Everything the Trainer runs with.
struct ExecutionPlan {
  std::shared_ptr<environments::ClusterEnvironment> environment;
  std::string accelerator;             ///< "cpu" or "cuda"
  int devices_per_node = 1;            ///< processes on this node
  std::vector<int> gpu_ids;            ///< cuda only
  int num_nodes = 1;
  Precision precision;                 ///< chosen once from --precision
  std::string process_group_backend;   ///< gloo, nccl or mpi
  std::shared_ptr<strategies::Strategy> strategy;
};

/// With auto_select_gpus, the GPU ids the process that picked them hands to the processes it
/// launches ("1,3"), so that every rank of the node uses the same devices without probing again.
constexpr const char* kSelectedGpusVariable = "LOCKSTEP_SELECTED_GPUS";

/// Resolves the plan in order: environment, accelerator, devices, the scheduler's consistency,
/// precision, backend, strategy. `strategy` overrides options.strategy() when given (a Strategy
/// object, as Lightning's Trainer(strategy=DDPStrategy(...))). `cuda_device_count` and
/// `probe` (used by auto_select_gpus) are injected for tests.
ExecutionPlan resolve_plan(const TrainerOptions& options, const environments::Environ& environ,
                           std::shared_ptr<strategies::Strategy> strategy = nullptr, int cuda_device_count = 0,
                           const accelerators::DeviceProbe& probe = accelerators::probe_cuda_device);

}  // namespace lockstep
