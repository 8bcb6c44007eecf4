#pragma once
// The ranks of a job on one node as threads of one process, each with the plan resolve_plan
// makes from the variables torchrun sets (the ranks meet through a store file), its process group
// joined: the strategy the Trainer and Fabric get, without starting processes.

#include <functional>
#include <memory>
#include <string>

#include <lockstep/environments/cluster_environment.h>
#include <lockstep/plan/connector.h>

#include "temp_dir.h"
#include "thread_ranks.h"

namespace lockstep {
namespace testing {

/// The variables torchrun sets in local rank `rank` of `world` processes on one node, with
/// Lockstep's store file.
inline environments::Environ torchrun_worker(int rank, int world, const std::string& store_file) {
  return environments::Environ({{"RANK", std::to_string(rank)},
                                {"GROUP_RANK", "0"},
                                {"LOCAL_RANK", std::to_string(rank)},
                                {"LOCAL_WORLD_SIZE", std::to_string(world)},
                                {"WORLD_SIZE", std::to_string(world)},
                                {"MASTER_ADDR", "127.0.0.1"},
                                {"MASTER_PORT", "29500"},
                                {"LOCKSTEP_STORE_FILE", store_file}});
}

/// body(plan) on each of `world` ranks, after setup_environment; `make_strategy`, when given,
/// makes each rank's strategy object (as Trainer::set_strategy).
inline void run_plan_ranks(int world, const PlanOptions& options, const std::function<void(ExecutionPlan&)>& body,
                           const std::function<std::shared_ptr<strategies::Strategy>()>& make_strategy = nullptr) {
  TempDir dir("lockstep_plan_ranks");
  const std::string store = dir / "store";
  run_threads(world, [&](int rank) {
    auto plan = resolve_plan(options, torchrun_worker(rank, world, store), make_strategy ? make_strategy() : nullptr);
    plan.strategy->setup_environment();
    body(plan);
    plan.strategy->teardown();
  });
}

}  // namespace testing
}  // namespace lockstep
