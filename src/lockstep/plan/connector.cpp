#include <lockstep/plan/connector.h>

#include <sched.h>

#include <algorithm>
#include <cctype>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <lockstep/accelerators/device_parser.h>
#include <lockstep/core/error.h>
#include <lockstep/distributed/process_group.h>
#include <lockstep/distributed/rank_zero.h>
#include <lockstep/environments/torchelastic_environment.h>
#include <lockstep/strategies/registry.h>

namespace lockstep {
namespace {

// Strategy names from Lightning and PyTorch that have no place here, and what to use instead.
const std::map<std::string, std::string>& not_available() {
  static const std::map<std::string, std::string> names{
      {"dp", "DataParallel splits one process's batch over several CUDA devices; on CPU, and with "
             "LibTorch, one process per device is faster. Use --strategy ddp"},
      {"ddp2", "ddp2 was removed from Lightning 1.7. Use --strategy ddp"},
      {"ddp_cpu", "ddp_cpu was removed from Lightning 1.7. Use --accelerator cpu --strategy ddp --devices N"},
      {"ddp_sharded", "sharded training (FairScale) is a Python library. Use --strategy ddp"},
      {"ddp_spawn", "spawning needs Python's multiprocessing. Use --strategy ddp (re-executes the program) "
                    "or ddp_fork"},
      {"horovod", "Horovod is not in Debian's LibTorch. Use --strategy ddp"},
      {"deepspeed", "DeepSpeed is a Python library. Use --strategy ddp"},
      {"xla", "XLA has no C++ frontend in LibTorch. Use --strategy ddp"},
  };
  return names;
}

// What --devices auto means under a scheduler: the processes it started on each node (on CUDA
// one device each, by local rank), and the words that say where the number came from.
struct SchedulerDevices {
  int per_node = 0;
  std::string how;
  bool from_num_nodes = false;  // the job's processes over --num-nodes, not a count per node
};

// The count the scheduler gives for this node (LOCAL_WORLD_SIZE, SLURM_NTASKS_PER_NODE, the MPI
// local size), else the job's processes over --num-nodes; nullopt where "auto" keeps its meaning
// without a scheduler (--devices given, or Lockstep starts the processes).
std::optional<SchedulerDevices> scheduler_devices(const PlanOptions& o, const environments::ClusterEnvironment& env) {
  if (o.devices() != "auto" || !env.creates_processes_externally()) return std::nullopt;
  const int local = env.placement().local_world_size;
  if (local > 0) {
    return SchedulerDevices{local, "--devices auto took the " + std::to_string(local) + " process(es) " + env.name() +
                                       " started on this node"};
  }
  const int world = env.world_size();
  LOCKSTEP_CHECK(world % o.num_nodes() == 0, UsageError, "--devices auto: ", env.name(), " started ", world,
                 " processes, which --num-nodes ", o.num_nodes(), " does not share evenly, and it does not say how "
                 "many run on this node. Give --devices (processes per node) and --num-nodes whose product is ",
                 world, ".");
  return SchedulerDevices{world / o.num_nodes(),
                          "--devices auto took the " + std::to_string(world) + " processes of the job over " +
                              "--num-nodes " + std::to_string(o.num_nodes()) + " = " +
                              std::to_string(world / o.num_nodes()) + " per node",
                          true};
}

// --auto-select-gpus probes once, in the process that starts the others; they read its pick.
// `spec` is --devices, or the scheduler's count for "auto".
std::vector<int> gpu_ids_for(const PlanOptions& o, const std::string& spec, const environments::Environ& environ,
                             const environments::ClusterEnvironment& env, int cuda_count,
                             const accelerators::DeviceProbe& probe) {
  auto ids = accelerators::parse_gpu_ids(spec, cuda_count);
  const bool names_ids = spec.find_first_of(",[") != std::string::npos;
  if (!o.auto_select_gpus() || names_ids) return ids;
  if (const auto picked = environ.get(accelerators::kSelectedGpusVariable)) {
    auto handed = accelerators::parse_gpu_ids(*picked, cuda_count);
    if (handed.size() != ids.size()) {
      throw UsageError(std::string(accelerators::kSelectedGpusVariable) + "=" + *picked + " names " + std::to_string(handed.size()) +
                       " device(s) but --devices " + o.devices() + " asks for " + std::to_string(ids.size()) +
                       "; it is left from another run: unset " + accelerators::kSelectedGpusVariable + ".");
    }
    return handed;
  }
  if (env.creates_processes_externally() && ids.size() > 1) {
    throw UsageError("--auto-select-gpus with --devices " + o.devices() + " under " + env.name() +
                     ": the scheduler started every process already, and each would probe on its own and could "
                     "pick other devices. Name the ids (--devices 0,1) or set CUDA_VISIBLE_DEVICES per node.");
  }
  return accelerators::select_gpu_ids(spec, cuda_count, probe);
}

int devices_for(const PlanOptions& o, const environments::Environ& environ,
                const environments::ClusterEnvironment& env, accelerators::Accelerator accelerator, int cuda_count,
                const accelerators::DeviceProbe& probe, std::vector<int>& gpu_ids) {
  const auto scheduled = scheduler_devices(o, env);
  if (accelerator != accelerators::Accelerator::cuda) {
    return scheduled ? scheduled->per_node : accelerators::parse_cpu_devices(o.devices());
  }
  if (scheduled && scheduled->per_node > cuda_count) {
    throw UsageError(scheduled->how + ", one CUDA device each by local rank, but this process sees " +
                     std::to_string(cuda_count) + " (CUDA_VISIBLE_DEVICES=" +
                     environ.get("CUDA_VISIBLE_DEVICES").value_or("unset") + "). Every process of a node must see "
                     "all of the node's GPUs: ask the scheduler for GPUs per node, not per task (srun "
                     "--gpus-per-node, not --gpus-per-task), or start " + std::to_string(cuda_count) +
                     " process(es) per node.");
  }
  gpu_ids = gpu_ids_for(o, scheduled ? std::to_string(scheduled->per_node) : o.devices(), environ, env, cuda_count,
                        probe);
  return static_cast<int>(gpu_ids.size());
}

void check_one_process(const std::string& what, const PlanOptions& o, int processes, const std::string& fix) {
  if (processes <= 1) return;
  throw UsageError(what + " runs one process, but --devices " + o.devices() + " --num-nodes " +
                   std::to_string(o.num_nodes()) + " asks for " + std::to_string(processes) + ". " + fix +
                   ", or --devices 1.");
}

// A Strategy object (set_strategy) is used as given; --strategy may only agree with it.
std::shared_ptr<strategies::Strategy> given_strategy(const PlanOptions& o, int processes,
                                                     std::shared_ptr<strategies::Strategy> given) {
  const std::string name = given->name();
  LOCKSTEP_CHECK(o.strategy() == "auto" || o.strategy() == name, UsageError, "--strategy ", o.strategy(),
                 " and set_strategy(", name, ") both choose the strategy. Leave --strategy at auto to use the "
                 "object, or drop the set_strategy call to use ", o.strategy(), ".");
  if (dynamic_cast<const strategies::SingleDeviceStrategy*>(given.get()) != nullptr) {
    check_one_process("set_strategy(" + name + ")", o, processes, "Use a DDPStrategy");
  }
  return given;
}

std::shared_ptr<strategies::Strategy> strategy_for(const PlanOptions& o, int processes,
                                                   std::shared_ptr<strategies::Strategy> given) {
  if (given) return given_strategy(o, processes, std::move(given));
  const std::string name = o.strategy() == "auto" ? (processes > 1 ? "ddp" : "single_device") : o.strategy();
  const auto reason = not_available().find(name);
  if (reason != not_available().end()) {
    throw UsageError("--strategy " + name + " is not available in Lockstep: " + reason->second + ".");
  }
  if (name == "single_device") check_one_process("--strategy single_device", o, processes, "Use --strategy ddp");
  return strategies::create_strategy(name);
}

// A process that Lockstep starts would read the same ranks from a user's environment as the
// first one, so only an environment whose scheduler starts every process is taken.
std::shared_ptr<environments::ClusterEnvironment> environment_for(
    const environments::Environ& environ, std::shared_ptr<environments::ClusterEnvironment> given) {
  if (!given) return environments::detect_environment(environ);
  LOCKSTEP_CHECK(given->creates_processes_externally(), UsageError, "set_cluster_environment: the environment '",
                 given->name(), "' does not start the processes (creates_processes_externally() is false), so "
                 "Lockstep would start them and each would take the same ranks from it. Return true there when "
                 "your scheduler starts every process, or leave the environment to detection.");
  return given;
}

// --num-nodes left at 1 under torchrun takes the nodes its rendezvous formed: an elastic one
// (--nnodes MIN:MAX) changes them from attempt to attempt, and nothing in a worker's environment
// says MIN and MAX. A --num-nodes given is still checked against WORLD_SIZE.
int nodes_for(const PlanOptions& o, const environments::ClusterEnvironment& env, int devices_per_node) {
  const auto& placement = env.placement();
  const bool torchrun = env.name() == "torchelastic" && env.creates_processes_externally();
  if (!torchrun || o.num_nodes() != 1 || devices_per_node != placement.local_world_size ||
      placement.world_size % devices_per_node != 0) {
    return o.num_nodes();
  }
  return placement.world_size / devices_per_node;
}

// The devices and nodes against the scheduler's job, or, without one, the manual recipe.
void check_placement(const PlanOptions& o, const environments::Environ& environ, const strategies::StrategyContext& c) {
  if (!c.environment->creates_processes_externally()) {
    // Several nodes without a scheduler: Lightning's manual recipe, NODE_RANK on each node (this
    // process starts its node's ranks), which the environment checks.
    const std::string nodes = std::to_string(c.num_nodes);
    LOCKSTEP_CHECK(c.num_nodes == 1 || environ.has("NODE_RANK"), UsageError, "--num-nodes ", nodes,
                   " but no scheduler started this process. Start this program once per node with NODE_RANK (0 to ",
                   c.num_nodes - 1, "), MASTER_ADDR (node 0's address) and MASTER_PORT set, or start one process "
                   "per node with `lockstep launch --nnodes ", nodes, " ...`, torchrun, srun or mpirun.");
    c.environment->validate_settings(c.devices_per_node, c.num_nodes);
    return;
  }
  try {
    c.environment->validate_settings(c.devices_per_node, c.num_nodes);
  } catch (const environments::EnvironmentError& e) {
    const auto scheduled = scheduler_devices(o, *c.environment);
    if (!scheduled) throw;
    // The user did not give --devices: say where the number came from.
    throw environments::EnvironmentError(scheduled->how + ". " + message_of(e) +
                                         (scheduled->from_num_nodes ? " Or give --num-nodes the job's node count." : ""));
  }
}

// --process-group-backend, or gloo on cpu and nccl on cuda; one this build can create.
std::string backend_for(const PlanOptions& o, accelerators::Accelerator accelerator) {
  const bool on_cuda = accelerator == accelerators::Accelerator::cuda;
  const std::string backend = o.process_group_backend().empty() ? (on_cuda ? "nccl" : "gloo") : o.process_group_backend();
  const auto backends = distributed::available_backends();
  if (std::find(backends.begin(), backends.end(), backend) == backends.end()) {
    std::string names;
    for (const auto& b : backends) names += (names.empty() ? "" : ", ") + b;
    throw UsageError("--process-group-backend " + backend + " is not available: this build of Lockstep can create " +
                     names + ". Use --process-group-backend " + backends.front() + "." +
                     (backend == "mpi" ? " Lockstep builds no MPI process group on any build; under mpirun the ranks "
                                         "meet over gloo or nccl." : ""));
  }
  LOCKSTEP_CHECK(backend != "nccl" || on_cuda, UsageError, "--process-group-backend nccl reduces CUDA tensors, but the "
                 "accelerator is ", accelerators::to_string(accelerator),
                 ". Use --accelerator cuda, or --process-group-backend gloo.");
  return backend;
}

// Once, for the Trainer and Fabric (Lightning's _validate_precision_choice): loss scaling checks
// every gradient for inf, and a strategy that shards state would let each rank see only its shard.
void check_precision_against_strategy(const ExecutionPlan& plan) {
  LOCKSTEP_CHECK(!plan.precision.scales_loss() || !plan.strategy->shards_state(), UsageError, "--precision ",
                 plan.precision.name(), " scales the loss, and its check for inf gradients would see only this "
                 "rank's shard under --strategy ", plan.strategy->name(),
                 ". Use --precision bf16-mixed or 32-true with it.");
}

// --distributed-debug: off or detail, in any case.
bool collectives_checked(const PlanOptions& o) {
  std::string debug = o.distributed_debug();
  std::transform(debug.begin(), debug.end(), debug.begin(), [](unsigned char ch) { return std::tolower(ch); });
  LOCKSTEP_CHECK(debug == "off" || debug == "detail", UsageError, "--distributed-debug '", o.distributed_debug(),
                 "' is not known: use off (the default) or detail (the ranks compare each collective's call first).");
  return debug == "detail";
}

// Only a job the Trainer launches itself, on this machine, can be started again by it.
void check_restarts(const PlanOptions& o, const environments::Environ& environ, const strategies::StrategyContext& c) {
  if (o.max_restarts() <= 0) return;
  const std::string fix = " Use the restarts of what starts the processes (lockstep launch --max-restarts " +
                          std::to_string(o.max_restarts()) + ", torchrun --max-restarts), and --ckpt-path last.";
  // A worker the Trainer launched has the launch's TORCHELASTIC_MAX_RESTARTS.
  const bool launched_by_us = environ.get("TORCHELASTIC_MAX_RESTARTS") == std::to_string(o.max_restarts());
  LOCKSTEP_CHECK(!c.environment->creates_processes_externally() || launched_by_us, UsageError, "--max-restarts ",
                 o.max_restarts(), ": this process was started by a launcher (", c.environment->name(),
                 "), not by the Trainer or Fabric.", fix);
  LOCKSTEP_CHECK(c.devices_per_node * c.num_nodes > 1 && c.num_nodes == 1, UsageError, "--max-restarts ",
                 o.max_restarts(), " restarts the processes the Trainer or Fabric launches on one machine (--devices 2 or "
                 "more, --num-nodes 1); this run has ", c.devices_per_node, " process(es) on ", c.num_nodes,
                 " node(s).", fix);
}

// Options that change nothing in this run: a note on rank 0, where Lightning would warn.
void note_idle_options(const PlanOptions& o, const strategies::StrategyContext& c) {
  if (c.environment->global_rank() != 0) return;
  if (o.auto_select_gpus() && c.accelerator != accelerators::Accelerator::cuda) {
    std::cerr << "lockstep: --auto-select-gpus true has no effect on the CPU: it picks free CUDA devices "
                 "(--accelerator cuda).\n";
  }
  if (o.sync_batchnorm() && c.devices_per_node * c.num_nodes == 1) {
    std::cerr << "lockstep: --sync-batchnorm true has no effect with one process: SyncBatchNorm shares batch "
                 "statistics between the processes of a job (--devices 2 or more).\n";
  }
}

// Once, in the process that launches the others.
void warn_if_ranks_outnumber_cores(const ExecutionPlan& plan) {
  if (plan.context.accelerator != accelerators::Accelerator::cpu) return;
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  if (::sched_getaffinity(0, sizeof(cpus), &cpus) != 0) return;
  const int cores = CPU_COUNT(&cpus);
  if (plan.context.devices_per_node <= cores) return;
  std::cerr << "lockstep: warning: --devices " << plan.context.devices_per_node << " starts " << plan.context.devices_per_node
            << " processes on " << cores << " CPU core(s): the ranks share cores and every step waits for the "
            << "slowest, so the job runs slower than with --devices " << cores << ".\n";
}

}  // namespace


ExecutionPlan resolve_plan(const PlanOptions& o, const environments::Environ& environ,
                           std::shared_ptr<strategies::Strategy> strategy, int cuda_count,
                           const accelerators::DeviceProbe& probe,
                           std::shared_ptr<environments::ClusterEnvironment> environment) {
  ExecutionPlan plan;
  auto& c = plan.context;
  c.environment = environment_for(environ, std::move(environment));
  c.accelerator = accelerators::parse_accelerator(o.accelerator(), cuda_count);
  LOCKSTEP_CHECK(o.num_nodes() >= 1, UsageError, "--num-nodes ", o.num_nodes(), " is not a node count: use 1 or more.");
  c.num_nodes = o.num_nodes();
  c.devices_per_node = devices_for(o, environ, *c.environment, c.accelerator, cuda_count, probe, c.gpu_ids);
  c.num_nodes = nodes_for(o, *c.environment, c.devices_per_node);
  check_placement(o, environ, c);
  plan.precision = Precision::parse(o.precision(), c.accelerator);
  c.process_group_backend = backend_for(o, c.accelerator);
  plan.strategy = strategy_for(o, c.devices_per_node * c.num_nodes, std::move(strategy));
  if (o.configure_strategy()) o.configure_strategy()(*plan.strategy);
  check_precision_against_strategy(plan);
  c.timeout_seconds = o.timeout();
  c.liveness_timeout_seconds = o.liveness_timeout();
  c.sync_batchnorm = o.sync_batchnorm();
  c.check_collectives = collectives_checked(o);
  c.max_restarts = static_cast<int>(o.max_restarts());
  check_restarts(o, environ, c);
  note_idle_options(o, c);
  plan.strategy->set_context(c);
  return plan;
}

ExecutionPlan launched_plan(ExecutionPlan plan, const distributed::Placement& placement) {
  plan.context.environment = std::make_shared<environments::TorchElasticEnvironment>(placement);
  plan.strategy->set_context(plan.context);
  return plan;
}

ExecutionPlan launch(ExecutionPlan plan) {
  if (auto launcher = plan.strategy->launcher()) {
    warn_if_ranks_outnumber_cores(plan);
    // Returns in rank 0 and in forked ranks with their placement; re-executed ranks run main()
    // again and find theirs in the environment, where resolve_plan read it.
    if (const auto placement = launcher->launch()) plan = launched_plan(std::move(plan), *placement);
    plan.self_launched = true;
  }
  plan.strategy->setup_environment();
  distributed::set_global_rank(plan.strategy->global_rank());
  return plan;
}

}  // namespace lockstep
