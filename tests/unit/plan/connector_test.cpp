// The connector's GPU decisions, with an injected CUDA device count and probe (this LibTorch is a
// CPU build): --auto-select-gpus picks free devices once and hands the pick to launched ranks;
// --devices auto under a scheduler; a user's own environment; the defaults the plan carries.
#include <lockstep/plan/connector.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>

#include <gtest/gtest.h>

#include <lockstep/core/error.h>
#include <lockstep/distributed/process_group.h>
#include <lockstep/fabric/fabric_options.h>
#include <lockstep/launchers/local_launcher.h>
#include <lockstep/launchers/worker_environment.h>
#include <lockstep/strategies/ddp_strategy.h>
#include <lockstep/strategies/fsdp_strategy.h>
#include <lockstep/trainer/trainer_options.h>
#include "../../support/errors.h"
#include "../../support/fake_gpus.h"
#include "../../support/paths.h"
#include "../../support/scheduler_environment.h"

namespace lockstep {
namespace {

using V = std::vector<int>;

using testing::FakeGpus;
using testing::error_of;

PlanOptions cuda(const std::string& devices) {
  return PlanOptions().accelerator("cuda").devices(devices).process_group_backend("gloo");
}

// A process started by torchrun (or by Lockstep's own launcher) as local rank 1 of 2.
std::map<std::string, std::string> launched_rank() {
  return {{"RANK", "1"}, {"GROUP_RANK", "0"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"},
          {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}};
}

TEST(ConnectorGpus, WithoutAutoSelectTheFirstNDevicesAreUsedUnprobed) {
  FakeGpus gpus{{0}};
  const auto plan = resolve_plan(cuda("2"), environments::Environ(), nullptr, 4, gpus.probe());
  EXPECT_EQ(plan.context.accelerator, accelerators::Accelerator::cuda);
  EXPECT_EQ(plan.context.gpu_ids, (V{0, 1}));
  EXPECT_EQ(plan.context.devices_per_node, 2);
  EXPECT_EQ(gpus.calls(), 0);
}

TEST(ConnectorGpus, AutoSelectPicksFreeDevicesForACount) {
  FakeGpus gpus{{0, 2}};
  const auto plan = resolve_plan(cuda("2").auto_select_gpus(true), environments::Environ(), nullptr, 4, gpus.probe());
  EXPECT_EQ(plan.context.gpu_ids, (V{1, 3}));
  EXPECT_EQ(plan.context.devices_per_node, 2);
  EXPECT_EQ(plan.strategy->name(), "ddp");
  EXPECT_EQ(plan.strategy->root_device(), torch::Device(torch::kCUDA, 1)) << "root device = first picked id";
}

TEST(ConnectorGpus, AutoSelectKeepsNamedIdsAndIgnoresCpu) {
  FakeGpus gpus{{0, 1, 2, 3}};
  auto plan = resolve_plan(cuda("0,3").auto_select_gpus(true), environments::Environ(), nullptr, 4, gpus.probe());
  EXPECT_EQ(plan.context.gpu_ids, (V{0, 3}));
  plan = resolve_plan(PlanOptions().accelerator("cpu").devices("1").auto_select_gpus(true), environments::Environ(),
                      nullptr, 4, gpus.probe());
  EXPECT_EQ(plan.context.accelerator, accelerators::Accelerator::cpu);
  EXPECT_TRUE(plan.context.gpu_ids.empty());
  EXPECT_EQ(gpus.calls(), 0);
}

TEST(ConnectorGpus, LaunchedRanksUseThePickOfTheProcessThatLaunchedThem) {
  FakeGpus gpus{{}};
  auto vars = launched_rank();
  vars[accelerators::kSelectedGpusVariable] = "1,3";
  const auto plan =
      resolve_plan(cuda("2").auto_select_gpus(true), environments::Environ(vars), nullptr, 4, gpus.probe());
  EXPECT_EQ(plan.context.gpu_ids, (V{1, 3}));
  EXPECT_EQ(plan.strategy->root_device(), torch::Device(torch::kCUDA, 3)) << "local rank 1 -> second picked id";
  EXPECT_EQ(gpus.calls(), 0) << "no second probe";

  vars[accelerators::kSelectedGpusVariable] = "1";
  EXPECT_NE(error_of([&] { resolve_plan(cuda("2").auto_select_gpus(true), environments::Environ(vars), nullptr, 4,
                                        gpus.probe()); })
                .find("unset LOCKSTEP_SELECTED_GPUS"),
            std::string::npos);
}

// The pick reaches the re-executed ranks through the launcher's worker variables, not through
// rank 0's own environment.
TEST(ConnectorGpus, TheLauncherHandsThePickToItsWorkers) {
  FakeGpus gpus{{0, 2}};
  const auto plan = resolve_plan(cuda("2").auto_select_gpus(true), environments::Environ(), nullptr, 4, gpus.probe());
  const auto launcher = plan.strategy->launcher();
  ASSERT_NE(launcher, nullptr);
  const auto& local = dynamic_cast<const launchers::LocalLauncher&>(*launcher);
  EXPECT_EQ(local.options().worker_variables().at(accelerators::kSelectedGpusVariable), "1,3");
  EXPECT_EQ(std::getenv(accelerators::kSelectedGpusVariable), nullptr) << "this process's environment is left alone";
  const auto worker = launchers::worker_variables(local.options(), 1, 29500);
  EXPECT_EQ(worker.at(accelerators::kSelectedGpusVariable), "1,3");
  EXPECT_EQ(worker.at("LOCAL_RANK"), "1") << "the launcher's own variables stay";
}

// After a launch the plan keeps its decisions and takes the launched process's placement; no
// second pass over the environment.
TEST(ConnectorPlan, ALaunchedProcessTakesItsPlacement) {
  auto plan = resolve_plan(PlanOptions().accelerator("cpu").devices("2").precision("64"), environments::Environ(),
                           nullptr, 0);
  ASSERT_EQ(plan.context.environment->name(), "local");
  distributed::Placement placement;
  placement.world_size = 2;
  placement.global_rank = 1;
  placement.local_rank = 1;
  placement.local_world_size = 2;
  placement.main_port = 29511;
  placement.store_file = "/tmp/store";
  const auto strategy = plan.strategy;
  plan = launched_plan(std::move(plan), placement);
  EXPECT_EQ(plan.context.environment->name(), "torchelastic");
  EXPECT_EQ(plan.context.environment->global_rank(), 1);
  EXPECT_EQ(plan.context.environment->main_port(), 29511);
  EXPECT_EQ(plan.context.environment->process_group_options().store_file(), "/tmp/store");
  EXPECT_EQ(plan.strategy, strategy);
  EXPECT_EQ(plan.strategy->context().environment, plan.context.environment) << "the strategy sees it too";
  EXPECT_EQ(plan.strategy->local_rank(), 1);
  EXPECT_EQ(plan.precision.name(), "64-true");
  EXPECT_EQ(plan.context.devices_per_node, 2);
}

TEST(ConnectorGpus, AutoSelectUnderAnExternalLauncherNeedsNamedIds) {
  FakeGpus gpus{{}};
  const auto message = error_of([&] {
    resolve_plan(cuda("2").auto_select_gpus(true), environments::Environ(launched_rank()), nullptr, 4, gpus.probe());
  });
  EXPECT_NE(message.find("--devices 0,1"), std::string::npos) << message;
  EXPECT_NE(message.find("torchelastic"), std::string::npos) << message;
  EXPECT_EQ(gpus.calls(), 0);
}

TEST(ConnectorGpus, TooFewFreeDevicesIsAUsageError) {
  // The real backoff waits here (0.01 + 0.02 + 0.04 + 0.08 s at most): the connector uses the defaults.
  FakeGpus gpus{{1, 2, 3}};
  const auto message = error_of([&] {
    resolve_plan(cuda("2").auto_select_gpus(true), environments::Environ(), nullptr, 4, gpus.probe());
  });
  EXPECT_NE(message.find("1 of the 4 visible CUDA device(s) is free"), std::string::npos) << message;
  EXPECT_EQ(gpus.calls(), 5 * 4);
}

// Mixed precision on CUDA autocasts there (16-mixed with loss scaling); on the CPU bf16-mixed
// autocasts on the CPU and 16-mixed is refused.
TEST(ConnectorPrecision, MixedPrecisionAutocastsOnTheAcceleratorsDevice) {
  FakeGpus gpus{{}};
  const auto on_cuda = [&](const char* precision) {
    return resolve_plan(cuda("1").precision(precision), environments::Environ(), nullptr, 1, gpus.probe()).precision;
  };
  EXPECT_EQ(on_cuda("16-mixed").kind(), Precision::Kind::f16_mixed);
  EXPECT_EQ(on_cuda("16").autocast_device(), c10::kCUDA);
  EXPECT_TRUE(on_cuda("16").scales_loss());
  EXPECT_EQ(on_cuda("bf16-mixed").kind(), Precision::Kind::bf16_mixed);
  EXPECT_EQ(on_cuda("bf16").autocast_device(), c10::kCUDA);
  EXPECT_FALSE(on_cuda("bf16").scales_loss());
  EXPECT_EQ(Precision::parse("bf16-mixed", accelerators::Accelerator::cpu).autocast_device(), c10::kCPU);
  EXPECT_EQ(Precision::parse("bf16", accelerators::Accelerator::cpu).kind(), Precision::Kind::bf16_mixed);
  EXPECT_EQ(Precision::parse("32", accelerators::Accelerator::cuda).name(), "32-true");
  EXPECT_EQ(Precision::parse("64", accelerators::Accelerator::cpu).kind(), Precision::Kind::true_64);
  const auto message = error_of<UsageError>([] { Precision::parse("16-mixed", accelerators::Accelerator::cpu); });
  EXPECT_NE(message.find("needs CUDA (float16 autocast); on CPU use --precision bf16-mixed"), std::string::npos) << message;
}

// Loss scaling (16-mixed) and a strategy that shards state are refused once, here, for the
// Trainer and Fabric alike (Lightning's _validate_precision_choice): the inf check would see one
// rank's shard. bf16-mixed, which scales nothing, goes with it.
TEST(ConnectorPrecision, LossScalingWithAStrategyThatShardsStateIsRefused) {
  FakeGpus gpus{{}};
  const auto plan = [&](const char* precision, const std::string& strategy) {
    return resolve_plan(cuda("1").precision(precision).strategy(strategy), environments::Environ(), nullptr, 1,
                        gpus.probe());
  };
  for (const std::string strategy : {"fsdp", "fsdp_shard_grad_op"}) {
    const auto message = error_of<UsageError>([&] { plan("16-mixed", strategy); });
    EXPECT_NE(message.find("--precision 16-mixed scales the loss, and its check for inf gradients would see only this "
                           "rank's shard under --strategy " + strategy +
                           ". Use --precision bf16-mixed or 32-true with it."),
              std::string::npos) << message;
    EXPECT_EQ(plan("bf16-mixed", strategy).strategy->name(), strategy);
  }
  EXPECT_TRUE(plan("16-mixed", "ddp").precision.scales_loss()) << "DDP keeps whole gradients";
}

// The backends this build can create are taken (nccl, the default on CUDA, with a LibTorch built
// with NCCL); any other is refused, listing the ones it can.
TEST(ConnectorBackend, OnlyTheBackendsThisBuildCanCreateAreTaken) {
  const auto backends = distributed::available_backends();
#ifdef USE_C10D_NCCL
  EXPECT_EQ(backends, (std::vector<std::string>{"gloo", "nccl"}));
  const std::string listed = "gloo, nccl";
#else
  EXPECT_EQ(backends, (std::vector<std::string>{"gloo"}));
  const std::string listed = "gloo";
#endif
  FakeGpus gpus{{}};
  for (const std::string backend : {"", "nccl", "mpi", "gloo"}) {
    const std::string taken = backend.empty() ? "nccl" : backend;
    auto options = cuda("1").process_group_backend(backend);
    if (std::find(backends.begin(), backends.end(), taken) != backends.end()) {
      const auto plan = resolve_plan(options, environments::Environ(), nullptr, 1, gpus.probe());
      EXPECT_EQ(plan.context.process_group_backend, taken);
      continue;
    }
    const auto message = error_of<UsageError>([&] { resolve_plan(options, environments::Environ(), nullptr, 1, gpus.probe()); });
    EXPECT_NE(message.find("is not available: this build of Lockstep can create " + listed +
                           ". Use --process-group-backend gloo."), std::string::npos) << backend << ": " << message;
  }
}

// Lockstep has no MPI process group on any build: the refusal says so, beside the usual fix.
TEST(ConnectorBackend, MpiIsRefusedSayingLockstepHasNoMpiBackend) {
  const auto message = error_of<UsageError>([] {
    resolve_plan(PlanOptions().accelerator("cpu").process_group_backend("mpi"), environments::Environ(), nullptr, 0);
  });
  EXPECT_NE(message.find("Use --process-group-backend gloo. Lockstep builds no MPI process group on any build; under "
                         "mpirun the ranks meet over gloo or nccl."),
            std::string::npos) << message;
}

// A Strategy object and a strategy name: the object is used when the name is auto or its own;
// another name is refused instead of being dropped.
TEST(ConnectorStrategy, AStrategyNameBesideAStrategyObjectMustAgreeWithIt) {
  const auto cpu2 = [] { return PlanOptions().accelerator("cpu").devices("2"); };
  for (const std::string name : {"auto", "ddp"}) {
    const auto object = std::make_shared<strategies::DDPStrategy>();
    EXPECT_EQ(resolve_plan(cpu2().strategy(name), environments::Environ(), object, 0).strategy, object) << name;
  }
  const auto message = error_of<UsageError>([&] {
    resolve_plan(cpu2().strategy("ddp_fork"), environments::Environ(), std::make_shared<strategies::DDPStrategy>(), 0);
  });
  EXPECT_NE(message.find("--strategy ddp_fork and set_strategy(ddp) both choose the strategy. Leave --strategy at "
                         "auto to use the object, or drop the set_strategy call to use ddp_fork."),
            std::string::npos) << message;
}

// The one-process check of single_device holds for an object too.
TEST(ConnectorStrategy, ASingleDeviceObjectWithSeveralProcessesIsRefused) {
  const auto single = std::make_shared<strategies::SingleDeviceStrategy>();
  EXPECT_EQ(resolve_plan(PlanOptions().accelerator("cpu").devices("1"), environments::Environ(), single, 0).strategy,
            single);
  const auto message = error_of<UsageError>([&] {
    resolve_plan(PlanOptions().accelerator("cpu").devices("2"), environments::Environ(), single, 0);
  });
  EXPECT_NE(message.find("set_strategy(single_device) runs one process, but --devices 2 --num-nodes 1 asks for 2. "
                         "Use a DDPStrategy, or --devices 1."),
            std::string::npos) << message;
}

// configure_strategy gets the strategy the connector chose, by name or as the object given, before
// the plan's context is set; a UsageError it throws is the plan's.
TEST(ConnectorStrategy, ConfigureStrategyGetsTheChosenStrategy) {
  std::vector<const strategies::Strategy*> seen;
  const auto options = PlanOptions().accelerator("cpu").devices("2").configure_strategy(
      [&](strategies::Strategy& strategy) {
        EXPECT_EQ(strategy.context().environment, nullptr) << "before set_context";
        seen.push_back(&strategy);
      });
  const auto named = resolve_plan(options, environments::Environ(), nullptr, 0);
  EXPECT_EQ(named.strategy->name(), "ddp");
  const auto object = std::make_shared<strategies::FSDPStrategy>();
  EXPECT_EQ(resolve_plan(options, environments::Environ(), object, 0).strategy, object);
  EXPECT_EQ(seen, (std::vector<const strategies::Strategy*>{named.strategy.get(), object.get()}));
  const auto refusing = PlanOptions().accelerator("cpu").configure_strategy([](strategies::Strategy& strategy) {
    throw UsageError("not for " + strategy.name());
  });
  EXPECT_EQ(error_of<UsageError>([&] { resolve_plan(refusing, environments::Environ(), nullptr, 0); }),
            "not for single_device");
}

// Options that cannot act in this run say so on rank 0, instead of doing nothing in silence.
TEST(ConnectorNotes, AutoSelectGpusOnTheCpuSaysItHasNoEffect) {
  for (const bool select : {true, false}) {
    ::testing::internal::CaptureStderr();
    resolve_plan(PlanOptions().accelerator("cpu").auto_select_gpus(select), environments::Environ(), nullptr, 0);
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(err.find("--auto-select-gpus true has no effect on the CPU: it picks free CUDA devices") !=
                  std::string::npos,
              select) << err;
  }
  ::testing::internal::CaptureStderr();
  resolve_plan(PlanOptions().accelerator("cpu").auto_select_gpus(true), environments::Environ(launched_rank()),
               nullptr, 0);
  const std::string rank1 = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(rank1.find("--auto-select-gpus"), std::string::npos) << "rank 1 said it too: " << rank1;
}

TEST(ConnectorNotes, SyncBatchnormWithOneProcessSaysItHasNoEffect) {
  for (const std::string devices : {"1", "2"}) {
    ::testing::internal::CaptureStderr();
    resolve_plan(PlanOptions().accelerator("cpu").devices(devices).sync_batchnorm(true), environments::Environ(),
                 nullptr, 0);
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(err.find("--sync-batchnorm true has no effect with one process") != std::string::npos, devices == "1")
        << devices << ": " << err;
  }
}

environments::Environ manual_node1() {
  return environments::Environ::from_env_file(std::string(LOCKSTEP_SOURCE_DIR) +
                                              "/tests/fixtures/environments/lightning_manual_node1.env");
}

// Lightning's manual multi-node recipe (WORLD_SIZE, NODE_RANK, MASTER_ADDR, MASTER_PORT; the same
// command on every node): this process launches its node's ranks into the job of all nodes.
TEST(ConnectorNodes, TheManualMultiNodeRecipeLaunchesThisNodesRanks) {
  const auto plan = resolve_plan(PlanOptions().accelerator("cpu").devices("4").num_nodes(2), manual_node1(), nullptr, 0);
  EXPECT_EQ(plan.context.environment->name(), "local");
  EXPECT_EQ(plan.strategy->name(), "ddp");
  const auto launcher = plan.strategy->launcher();
  ASSERT_NE(launcher, nullptr);
  const auto& options = dynamic_cast<const launchers::LocalLauncher&>(*launcher).options();
  EXPECT_EQ(options.nnodes(), 2);
  EXPECT_EQ(options.node_rank(), 1);
  EXPECT_EQ(options.nproc_per_node(), 4);
  EXPECT_EQ(options.master_addr(), "gpu-node01");
  EXPECT_EQ(options.master_port(), 29500);
  const auto worker = launchers::worker_variables(options, 3, 29500);
  EXPECT_EQ(worker.at("RANK"), "7");
  EXPECT_EQ(worker.at("WORLD_SIZE"), "8");
  EXPECT_EQ(worker.at("GROUP_RANK"), "1");
}

// What does not add up is refused with the fix; without NODE_RANK the refusal names the recipe.
TEST(ConnectorNodes, TheManualRecipeRefusesWhatDoesNotAddUp) {
  const auto cpu = [](const char* devices, int nodes) {
    return PlanOptions().accelerator("cpu").devices(devices).num_nodes(nodes);
  };
  const auto node1 = manual_node1().vars();
  const auto message = [&](const PlanOptions& options, std::map<std::string, std::string> vars) {
    return error_of<environments::EnvironmentError>(
        [&] { resolve_plan(options, environments::Environ(vars), nullptr, 0); });
  };
  auto no_port = node1;
  no_port.erase("MASTER_PORT");
  auto outside = node1;
  outside["NODE_RANK"] = "2";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {message(cpu("2", 2), node1), "WORLD_SIZE=8 but --devices 2 --num-nodes 2 start 4 processes in all. Use "
                                    "--devices 4 (WORLD_SIZE / --num-nodes), set WORLD_SIZE=4, or unset it."},
      {message(cpu("4", 2), outside), "NODE_RANK=2 but --num-nodes 2: node ranks run from 0 to 1."},
      {message(cpu("4", 2), no_port), "needs MASTER_ADDR and MASTER_PORT on every node"},
  };
  for (const auto& [said, expected] : cases) EXPECT_NE(said.find(expected), std::string::npos) << said;
  const auto alone = error_of<UsageError>([&] { resolve_plan(cpu("2", 2), environments::Environ(), nullptr, 0); });
  EXPECT_NE(alone.find("--num-nodes 2 but no scheduler started this process. Start this program once per node with "
                       "NODE_RANK (0 to 1), MASTER_ADDR (node 0's address) and MASTER_PORT set, or start one process "
                       "per node with `lockstep launch --nnodes 2 ...`"),
            std::string::npos) << alone;
}

// A recorded job's environment (tests/fixtures/environments), with some variables set or removed.
environments::Environ recorded(const std::string& name,
                               const std::map<std::string, std::optional<std::string>>& changes = {}) {
  auto vars = environments::Environ::from_env_file(std::string(LOCKSTEP_SOURCE_DIR) + "/tests/fixtures/environments/" +
                                                   name)
                  .vars();
  for (const auto& [variable, value] : changes) {
    if (value) {
      vars[variable] = *value;
    } else {
      vars.erase(variable);
    }
  }
  return environments::Environ(vars);
}

// 2 nodes with 4 GPUs each, one task per node (sbatch --ntasks-per-node=1, torchrun
// --nproc_per_node=1): "auto" is the scheduler's 1 process per node, not the node's 4 GPUs.
TEST(ConnectorSchedulerDevices, AutoIsTheOneTaskPerNodeOfSlurmAndTorchrunNotEveryGpu) {
  FakeGpus gpus{{}};
  for (const std::string job : {"slurm_srun_one_task_per_node_rank1.env", "torchrun_one_proc_per_node_rank1.env"}) {
    const auto plan = resolve_plan(cuda("auto").num_nodes(2), recorded(job), nullptr, 4, gpus.probe());
    EXPECT_EQ(plan.context.accelerator, accelerators::Accelerator::cuda) << job;
    EXPECT_EQ(plan.context.devices_per_node, 1) << job;
    EXPECT_EQ(plan.context.gpu_ids, (V{0})) << job;
    EXPECT_EQ(plan.strategy->name(), "ddp") << job;
    EXPECT_EQ(plan.strategy->global_rank(), 1) << job;
    EXPECT_EQ(plan.strategy->root_device(), torch::Device(torch::kCUDA, 0)) << job;
  }
  EXPECT_EQ(gpus.calls(), 0);
}

// Several tasks per node: each process uses the GPU of its local rank.
TEST(ConnectorSchedulerDevices, EachProcessUsesTheGpuOfItsLocalRank) {
  FakeGpus gpus{{}};
  auto plan = resolve_plan(cuda("auto").num_nodes(2), recorded("slurm_srun_rank5.env"), nullptr, 4, gpus.probe());
  EXPECT_EQ(plan.context.gpu_ids, (V{0, 1, 2, 3}));
  EXPECT_EQ(plan.strategy->root_device(), torch::Device(torch::kCUDA, 1)) << "SLURM_LOCALID=1";
  // torchrun --nproc_per_node=2 on nodes with 4 GPUs: 2 devices, local rank 1 on cuda:1.
  const auto two_per_node = recorded("torchrun_two_nodes_rank5.env", {{"LOCAL_WORLD_SIZE", "2"}, {"WORLD_SIZE", "4"},
                                                                      {"RANK", "3"}});
  plan = resolve_plan(cuda("auto").num_nodes(2), two_per_node, nullptr, 4, gpus.probe());
  EXPECT_EQ(plan.context.devices_per_node, 2);
  EXPECT_EQ(plan.context.gpu_ids, (V{0, 1}));
  EXPECT_EQ(plan.strategy->root_device(), torch::Device(torch::kCUDA, 1));
  // srun without --ntasks-per-node says no count per node: the job's 2 tasks over --num-nodes 2.
  plan = resolve_plan(cuda("auto").num_nodes(2),
                      recorded("slurm_srun_one_task_per_node_rank1.env", {{"SLURM_NTASKS_PER_NODE", std::nullopt}}),
                      nullptr, 4, gpus.probe());
  EXPECT_EQ(plan.context.devices_per_node, 1);
  // The same rule on the CPU: the scheduler's processes per node.
  plan = resolve_plan(PlanOptions().accelerator("cpu").num_nodes(2), recorded("torchrun_one_proc_per_node_rank1.env"),
                      nullptr, 4, gpus.probe());
  EXPECT_EQ(plan.context.devices_per_node, 1);
}

// An elastic torchrun job (--nnodes 2:3) re-forms at another size, which its workers only see in
// WORLD_SIZE: --num-nodes left at 1 takes the nodes the rendezvous formed; a count given must match.
TEST(ConnectorSchedulerDevices, UnderTorchrunNumNodesLeftAtOneTakesTheNodesTheRendezvousFormed) {
  FakeGpus gpus{{}};
  const auto two_nodes = recorded("torchrun_one_proc_per_node_rank1.env");
  auto plan = resolve_plan(PlanOptions().accelerator("cpu"), two_nodes, nullptr, 0, gpus.probe());
  EXPECT_EQ(plan.context.num_nodes, 2);
  EXPECT_EQ(plan.context.devices_per_node, 1);
  const auto three_nodes = recorded("torchrun_one_proc_per_node_rank1.env", {{"WORLD_SIZE", "3"}, {"RANK", "2"},
                                                                             {"GROUP_RANK", "2"}});
  plan = resolve_plan(PlanOptions().accelerator("cpu"), three_nodes, nullptr, 0, gpus.probe());
  EXPECT_EQ(plan.context.num_nodes, 3);
  const auto message = error_of<environments::EnvironmentError>(
      [&] { resolve_plan(PlanOptions().accelerator("cpu").num_nodes(2), three_nodes, nullptr, 0, gpus.probe()); });
  EXPECT_NE(message.find("torchrun's WORLD_SIZE=3. Use --num-nodes 3"), std::string::npos) << message;
}

// Where the job and the options truly disagree, the message says what "auto" took and from where.
TEST(ConnectorSchedulerDevices, ADisagreementSaysWhatAutoTookAndFromWhere) {
  FakeGpus gpus{{}};
  // 4 tasks on each of 2 nodes, but --num-nodes left at 1.
  auto message = error_of<environments::EnvironmentError>(
      [&] { resolve_plan(cuda("auto"), recorded("slurm_srun_rank5.env"), nullptr, 4, gpus.probe()); });
  EXPECT_NE(message.find("--devices auto took the 4 process(es) slurm started on this node. You set --num-nodes=1 "
                         "but the SLURM job runs on SLURM_STEP_NUM_NODES=2 nodes. Use --num-nodes 2"),
            std::string::npos) << message;
  // No count per node: the job's processes over --num-nodes, and the node count is the fix.
  message = error_of<environments::EnvironmentError>([&] {
    resolve_plan(cuda("auto"),
                 recorded("slurm_srun_one_task_per_node_rank1.env", {{"SLURM_NTASKS_PER_NODE", std::nullopt}}),
                 nullptr, 4, gpus.probe());
  });
  EXPECT_NE(message.find("--devices auto took the 2 processes of the job over --num-nodes 1 = 2 per node. "),
            std::string::npos) << message;
  EXPECT_NE(message.find("Or give --num-nodes the job's node count."), std::string::npos) << message;
  // srun --gpus-per-task: each of the 4 tasks of a node sees one GPU.
  message = error_of([&] {
    resolve_plan(cuda("auto").num_nodes(2), recorded("slurm_srun_rank5.env", {{"CUDA_VISIBLE_DEVICES", "1"}}),
                 nullptr, 1, gpus.probe());
  });
  EXPECT_NE(message.find("--devices auto took the 4 process(es) slurm started on this node, one CUDA device each by "
                         "local rank, but this process sees 1 (CUDA_VISIBLE_DEVICES=1)"),
            std::string::npos) << message;
  // 3 tasks that 2 nodes cannot share evenly, and no count per node.
  message = error_of([&] {
    resolve_plan(PlanOptions().accelerator("cpu").num_nodes(2),
                 recorded("slurm_srun_one_task_per_node_rank1.env",
                          {{"SLURM_NTASKS_PER_NODE", std::nullopt}, {"SLURM_NTASKS", "3"}}),
                 nullptr, 0, gpus.probe());
  });
  EXPECT_NE(message.find("--devices auto: slurm started 3 processes, which --num-nodes 2 does not share evenly"),
            std::string::npos) << message;
  // --devices given: the scheduler's own message, without a word about auto.
  message = error_of<environments::EnvironmentError>([&] {
    resolve_plan(cuda("2").num_nodes(2), recorded("slurm_srun_rank5.env"), nullptr, 4, gpus.probe());
  });
  EXPECT_EQ(message.find("auto"), std::string::npos) << message;
  EXPECT_NE(message.find("Use --devices 4"), std::string::npos) << message;
}

// Lightning's plugins=[MyClusterEnvironment()]: the plan takes the ranks and the address of the
// user's environment, not of the one detected (here torchrun's).
TEST(ConnectorEnvironment, AUsersEnvironmentGivesThePlanItsRanksAndAddress) {
  FakeGpus gpus{{}};
  const auto mine = testing::scheduler_environment(5, 8, 4, "10.1.2.3", 29777);
  const auto plan = resolve_plan(PlanOptions().accelerator("cpu").num_nodes(2),
                                 recorded("torchrun_single_node_rank1.env"), nullptr, 0, gpus.probe(), mine);
  EXPECT_EQ(plan.context.environment, mine);
  EXPECT_EQ(plan.context.devices_per_node, 4) << "its 4 processes per node";
  EXPECT_EQ(plan.strategy->name(), "ddp");
  EXPECT_EQ(plan.strategy->global_rank(), 5);
  EXPECT_EQ(plan.strategy->world_size(), 8);
  EXPECT_EQ(plan.strategy->local_rank(), 1);
  EXPECT_EQ(plan.strategy->node_rank(), 1);
  EXPECT_EQ(plan.strategy->launcher(), nullptr) << "its scheduler started the processes";
  const auto group = plan.context.environment->process_group_options();
  EXPECT_EQ(group.main_address(), "10.1.2.3");
  EXPECT_EQ(group.main_port(), 29777);
  EXPECT_EQ(group.rank(), 5);
}

TEST(ConnectorEnvironment, AUsersEnvironmentThatStartsNoProcessesIsRefused) {
  FakeGpus gpus{{}};
  distributed::Placement placement;
  const auto message = error_of([&] {
    resolve_plan(PlanOptions().accelerator("cpu"), environments::Environ(), nullptr, 0, gpus.probe(),
                 std::make_shared<testing::SchedulerEnvironment>(placement, false));
  });
  EXPECT_NE(message.find("the environment 'my_scheduler' does not start the processes (creates_processes_externally() "
                         "is false)"),
            std::string::npos) << message;
}

// 1800 s, as PyTorch's default_pg_timeout, from the options into the plan and the strategy.
TEST(ConnectorPlan, TheDefaultTimeoutIs1800Seconds) {
  EXPECT_EQ(PlanOptions().timeout(), 1800.0);
  EXPECT_EQ(TrainerOptions().timeout(), 1800.0);
  EXPECT_EQ(FabricOptions().timeout(), 1800.0);
  auto plan = resolve_plan(PlanOptions().accelerator("cpu").devices("2"), environments::Environ(), nullptr, 0);
  EXPECT_EQ(plan.context.timeout_seconds, 1800.0);
  EXPECT_EQ(plan.strategy->context().timeout_seconds, 1800.0);
  plan = resolve_plan(PlanOptions().accelerator("cpu").timeout(60), environments::Environ(), nullptr, 0);
  EXPECT_EQ(plan.strategy->context().timeout_seconds, 60.0);
}

// --strategy auto (Lightning's AcceleratorConnector): ddp for more than one process, counting
// every node's, else single_device; on CUDA the same from the device count.
TEST(ConnectorPlan, AutoStrategyIsDdpForSeveralProcessesElseSingleDevice) {
  const environments::Environ none;
  EXPECT_EQ(resolve_plan(PlanOptions().accelerator("cpu"), none, nullptr, 0).strategy->name(), "single_device");
  EXPECT_EQ(resolve_plan(PlanOptions().accelerator("cpu").devices("1"), none, nullptr, 0).strategy->name(),
            "single_device");
  EXPECT_EQ(resolve_plan(PlanOptions().accelerator("cpu").devices("3"), none, nullptr, 0).strategy->name(), "ddp");
  FakeGpus gpus{{}};
  EXPECT_EQ(resolve_plan(cuda("auto"), none, nullptr, 1, gpus.probe()).strategy->name(), "single_device");
  EXPECT_EQ(resolve_plan(cuda("auto"), none, nullptr, 2, gpus.probe()).strategy->name(), "ddp");
  // One process per node on two nodes (torchrun, 1 per node) is still a job of 2: ddp.
  const auto plan = resolve_plan(PlanOptions().accelerator("cpu").num_nodes(2),
                                 recorded("torchrun_one_proc_per_node_rank1.env"), nullptr, 0);
  EXPECT_EQ(plan.context.devices_per_node, 1);
  EXPECT_EQ(plan.strategy->name(), "ddp");
}

// single_device on CUDA computes on the device asked for: the first for a count, else the id.
TEST(ConnectorGpus, SingleDeviceRootIsTheDeviceAskedFor) {
  FakeGpus gpus{{}};
  const std::map<std::string, int> root_of{{"1", 0}, {"2,", 2}, {"[3]", 3}, {"auto", 0}};
  for (const auto& [devices, id] : root_of) {
    const int visible = devices == "auto" ? 1 : 4;
    const auto plan = resolve_plan(cuda(devices), environments::Environ(), nullptr, visible, gpus.probe());
    EXPECT_EQ(plan.strategy->name(), "single_device") << devices;
    EXPECT_EQ(plan.strategy->root_device(), torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(id))) << devices;
  }
}

}  // namespace
}  // namespace lockstep
