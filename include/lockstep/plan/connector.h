#pragma once
/// The connector (seed: Lightning's AcceleratorConnector): turns PlanOptions (of the Trainer or of
/// Fabric) and the process environment into one plan, as a short ordered list of decisions. Bad or contradictory
/// settings are UsageErrors naming the fix.

#include <memory>
#include <string>
#include <vector>

#include <lockstep/accelerators/device_parser.h>
#include <lockstep/environments/cluster_environment.h>
#include <lockstep/plan/plan_options.h>
#include <lockstep/plan/precision.h>
#include <lockstep/strategies/strategy.h>

namespace lockstep {

/// Everything the Trainer or Fabric runs with; decided once, not changed afterwards.
struct ExecutionPlan {
  /// Environment, accelerator, devices, nodes, backend, timeout: what the strategy is set with.
  strategies::StrategyContext context;
  Precision precision;  ///< chosen once from --precision
  std::shared_ptr<strategies::Strategy> strategy;
  /// The strategy's launcher started this node's processes from here (self-launch): set by
  /// launch() in rank 0 and in forked ranks.
  bool self_launched = false;
};

/// Resolves the plan in order: environment, accelerator, devices, the scheduler's consistency,
/// precision, backend, strategy. `strategy` overrides options.strategy() when given (a Strategy
/// object, as Lightning's Trainer(strategy=DDPStrategy(...))); `environment` replaces the one
/// detected from `environ` when given (Lightning's plugins=[MyClusterEnvironment()]); it must be
/// one whose scheduler started every process. `cuda_device_count` and `probe` (used by
/// auto_select_gpus) are injected for tests.
///
/// Under a scheduler, devices "auto" is the number of processes it started on each node (its
/// local world size where it gives one, else its world size over num_nodes); on CUDA each
/// process then uses the GPU of its local rank.
ExecutionPlan resolve_plan(const PlanOptions& options, const environments::Environ& environ,
                           std::shared_ptr<strategies::Strategy> strategy = nullptr, int cuda_device_count = 0,
                           const accelerators::DeviceProbe& probe = accelerators::probe_cuda_device,
                           std::shared_ptr<environments::ClusterEnvironment> environment = nullptr);

/// The plan of a process that `plan`'s launcher started at `placement`: the same decisions, in
/// the torchelastic-style environment that a re-executed worker detects from its variables.
/// Sets the strategy's context.
ExecutionPlan launched_plan(ExecutionPlan plan, const distributed::Placement& placement);

/// Starts the job `plan` describes, from this process, as the Trainer and Fabric do: when the
/// strategy has a launcher, starts this node's other processes (re-executed ones run main() again
/// and arrive here with their own plan), then joins the process group. Returns this process's plan.
ExecutionPlan launch(ExecutionPlan plan);

}  // namespace lockstep
