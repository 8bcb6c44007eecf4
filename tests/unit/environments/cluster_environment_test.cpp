#include "lockstep/environments/cluster_environment.h"

#include <gtest/gtest.h>

#include "../../support/environment_fixtures.h"
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "lockstep/environments/lsf_environment.h"
#include "lockstep/environments/mpi_environment.h"

using namespace lockstep::environments;
using lockstep::testing::contains;
using lockstep::testing::error_of;
using lockstep::testing::fixture;
using lockstep::testing::with;
using Vars = std::map<std::string, std::string>;

TEST(Environ, GetAndHas) {
  Environ env(Vars{{"A", "1"}, {"EMPTY", ""}});
  EXPECT_EQ(env.get("A"), "1");
  EXPECT_EQ(env.get("EMPTY"), "");
  EXPECT_TRUE(env.has("EMPTY"));
  EXPECT_FALSE(env.get("B").has_value());
  EXPECT_FALSE(env.has("B"));
}

TEST(Environ, GetIntParsesNonNegativeIntegers) {
  Environ env(Vars{{"RANK", "7"}, {"ZERO", "0"}, {"PADDED", "007"}});
  EXPECT_EQ(env.get_int("RANK"), 7);
  EXPECT_EQ(env.get_int("ZERO"), 0);
  EXPECT_EQ(env.get_int("PADDED"), 7);
  EXPECT_FALSE(env.get_int("UNSET").has_value());
}

TEST(Environ, GetIntRejectsWhatIsNotANonNegativeInteger) {
  std::string message = error_of([] { Environ(Vars{{"RANK", "abc"}}).get_int("RANK"); });
  EXPECT_TRUE(contains(message, "RANK=abc"));
  EXPECT_TRUE(contains(message, "Set RANK to a whole number"));
  EXPECT_TRUE(contains(error_of([] { Environ(Vars{{"RANK", "-1"}}).get_int("RANK"); }), "RANK=-1"));
  EXPECT_TRUE(contains(error_of([] { Environ(Vars{{"RANK", " 1"}}).get_int("RANK"); }), "RANK= 1"));
  EXPECT_TRUE(contains(error_of([] { Environ(Vars{{"RANK", ""}}).get_int("RANK"); }), "empty"));
  EXPECT_TRUE(contains(error_of([] { Environ(Vars{{"N", "99999999999"}}).get_int("N"); }),
                       "too large"));
}

TEST(Environ, ParsePortChecksTheRange) {
  namespace detail = lockstep::environments::detail;
  EXPECT_EQ(detail::parse_port("MASTER_PORT", "29500"), 29500);
  EXPECT_EQ(detail::parse_port("MASTER_PORT", "65535"), 65535);
  EXPECT_TRUE(contains(error_of([] { detail::parse_port("MASTER_PORT", "0"); }),
                       "MASTER_PORT=0 is outside 1..65535"));
  EXPECT_TRUE(contains(error_of([] { detail::parse_port("MASTER_PORT", "70000"); }),
                       "MASTER_PORT=70000"));
  EXPECT_TRUE(contains(error_of([] { detail::parse_port("MASTER_PORT", "http"); }),
                       "MASTER_PORT=http is not a port number"));
}

TEST(Environ, FromEnvFileReadsMultiLineValues) {
  Environ env = fixture("slurm_srun_rank5.env");
  EXPECT_EQ(env.get("SLURM_JOB_NAME"), "fmnist-ddp");
  EXPECT_EQ(env.get("SLURM_WORKING_CLUSTER"), "hpc1:slurmctl01:6817:9728:109");
  auto function = env.get("BASH_FUNC_module%%");
  ASSERT_TRUE(function.has_value());
  EXPECT_EQ(function->substr(0, 4), "() {");
  EXPECT_EQ(function->back(), '}');
  // A continuation line holding '=' belongs to the function, not to a variable of its own.
  EXPECT_NE(function->find("\n __lmod_my_status=$?;\n"), std::string::npos);
  EXPECT_FALSE(env.has(" __lmod_my_status"));
  EXPECT_EQ(env.get("CUDA_VISIBLE_DEVICES"), "0,1,2,3");
}

TEST(Environ, FromEnvFileNamesAMissingFile) {
  EXPECT_TRUE(contains(error_of([] { Environ::from_env_file("/nonexistent/job.env"); }),
                       "/nonexistent/job.env"));
}

TEST(Environ, FromProcessSeesTheProcessEnvironment) {
  ::setenv("LOCKSTEP_ENVIRONMENTS_TEST", "a=b", 1);
  Environ env = Environ::from_process();
  EXPECT_EQ(env.get("LOCKSTEP_ENVIRONMENTS_TEST"), "a=b");
  ::unsetenv("LOCKSTEP_ENVIRONMENTS_TEST");
}

struct DetectCase {
  const char* fixture;
  const char* expected;
  int world_size;
  int global_rank;
  int local_rank;
  int node_rank;
  const char* main_address;
  int main_port;  // 0: any (a free port)
};

class DetectEnvironment : public ::testing::TestWithParam<DetectCase> {};

TEST_P(DetectEnvironment, PicksTheRightEnvironmentAndReadsIt) {
  const DetectCase& c = GetParam();
  auto environment = detect_environment(fixture(c.fixture));
  EXPECT_EQ(environment->name(), c.expected) << c.fixture;
  EXPECT_EQ(environment->world_size(), c.world_size) << c.fixture;
  EXPECT_EQ(environment->global_rank(), c.global_rank) << c.fixture;
  EXPECT_EQ(environment->local_rank(), c.local_rank) << c.fixture;
  EXPECT_EQ(environment->node_rank(), c.node_rank) << c.fixture;
  EXPECT_EQ(environment->main_address(), c.main_address) << c.fixture;
  if (c.main_port != 0) {
    EXPECT_EQ(environment->main_port(), c.main_port) << c.fixture;
  }
  EXPECT_EQ(environment->creates_processes_externally(), std::string(c.expected) != "local");
}

INSTANTIATE_TEST_SUITE_P(
    RecordedJobs, DetectEnvironment,
    ::testing::Values(
        DetectCase{"laptop.env", "local", 1, 0, 0, 0, "127.0.0.1", 0},
        DetectCase{"torchrun_single_node_rank1.env", "torchelastic", 2, 1, 1, 0, "127.0.0.1",
                   29511},
        DetectCase{"torchrun_two_nodes_rank5.env", "torchelastic", 8, 5, 1, 1, "gpu-node01",
                   44517},
        DetectCase{"slurm_srun_rank5.env", "slurm", 8, 5, 1, 1, "gpu-a07", 17137},
        // srun --pty bash: the interactive allocation is ignored.
        DetectCase{"slurm_interactive_bash.env", "local", 1, 0, 0, 0, "127.0.0.1", 0},
        // torchrun inside an srun step: torchrun's variables describe the worker.
        DetectCase{"slurm_torchrun_rank6.env", "torchelastic", 8, 6, 2, 1, "gpu-c01", 51234},
        // mpirun inside sbatch: both ranks decide MPI, and agree on where rank 0 is.
        DetectCase{"slurm_sbatch_mpirun_rank0.env", "mpi", 8, 0, 0, 0, "cpu-b03", 29500},
        DetectCase{"slurm_sbatch_mpirun_rank6.env", "mpi", 8, 6, 2, 1, "cpu-b03", 29500},
        DetectCase{"openmpi_single_node_rank3.env", "mpi", 4, 3, 3, 0, "127.0.0.1", 29500},
        DetectCase{"openmpi_two_nodes_rank6.env", "mpi", 8, 6, 2, 1, "node01", 29610},
        DetectCase{"intel_mpi_rank5.env", "mpi", 8, 5, 1, 1, "icx-01", 29500},
        DetectCase{"kubeflow_worker_rank2.env", "kubeflow", 4, 2, 0, 2, "fmnist-master-0", 23456},
        // torchrun inside a PyTorchJob pod: torchelastic wins.
        DetectCase{"kubeflow_torchrun_rank5.env", "torchelastic", 8, 5, 1, 1, "fmnist-master-0",
                   23456}),
    [](const auto& info) {
      std::string name = info.param.fixture;
      return name.substr(0, name.find('.'));
    });

TEST(DetectEnvironment, LsfWinsOverTheMpiVariablesJsrunAlsoSets) {
  char host[HOST_NAME_MAX + 1] = {};
  ASSERT_EQ(::gethostname(host, sizeof(host) - 1), 0);
  std::string rankfile = ::testing::TempDir() + "lockstep_lsf_detect.rankfile";
  {
    std::ofstream out(rankfile);
    out << "batch3\n" << host << "\n" << host << "\nother-host\nother-host\n";
  }
  auto environment =
      detect_environment(with(fixture("lsf_jsrun_rank5.env"), {{"LSB_DJOB_RANKFILE", rankfile}}));
  EXPECT_EQ(environment->name(), "lsf");
  EXPECT_EQ(environment->node_rank(), 0);
  EXPECT_EQ(environment->main_address(), host);
  EXPECT_EQ(environment->main_port(), 10853);
  std::remove(rankfile.c_str());
}

TEST(DetectEnvironment, HalfSetTorchrunVariablesAreAnError) {
  std::string message =
      error_of([] { detect_environment(with(fixture("laptop.env"), {{"RANK", "1"}})); });
  EXPECT_TRUE(contains(message, "RANK=1 is set"));
  EXPECT_TRUE(contains(message, "LOCAL_RANK, WORLD_SIZE, GROUP_RANK, LOCAL_WORLD_SIZE are not"));
  EXPECT_TRUE(contains(message, "unset RANK"));

  message = error_of([] {
    detect_environment(with(fixture("laptop.env"),
                            {{"RANK", "1"}, {"LOCAL_RANK", "1"}, {"WORLD_SIZE", "2"}}));
  });
  EXPECT_TRUE(contains(message, "RANK=1, LOCAL_RANK=1, WORLD_SIZE=2 are set"));
  EXPECT_TRUE(contains(message, "GROUP_RANK, LOCAL_WORLD_SIZE are not"));
  EXPECT_TRUE(contains(message, "Launch with torchrun"));
}

TEST(DetectEnvironment, HalfSetInsideAnInteractiveSlurmShellIsStillAnError) {
  std::string message = error_of([] {
    detect_environment(with(fixture("slurm_interactive_bash.env"), {{"WORLD_SIZE", "4"}}));
  });
  EXPECT_TRUE(contains(message, "WORLD_SIZE=4 is set"));
}

TEST(DetectEnvironment, KubeflowWithoutMasterPortIsHalfSet) {
  std::string message = error_of([] {
    detect_environment(with(fixture("kubeflow_worker_rank2.env"), {{"MASTER_PORT", std::nullopt}}));
  });
  EXPECT_TRUE(contains(message, "RANK=2, WORLD_SIZE=4 are set"));
  EXPECT_TRUE(contains(message, "Kubeflow PyTorchJob"));
  EXPECT_TRUE(contains(message, "here MASTER_PORT did not reach the container"));
}

TEST(DetectEnvironment, TorchrunWithoutWorldSizeSaysHowToFixIt) {
  std::string message = error_of([] {
    detect_environment(
        with(fixture("torchrun_single_node_rank1.env"), {{"WORLD_SIZE", std::nullopt}}));
  });
  EXPECT_EQ(message,
            "RANK=1 is set but WORLD_SIZE is not: torchrun sets both; set WORLD_SIZE to the number "
            "of processes or unset RANK.");
}

TEST(DetectEnvironment, InvalidValuesDoNotFallThroughToTheNextEnvironment) {
  std::string message = error_of([] {
    detect_environment(with(fixture("slurm_srun_rank5.env"), {{"SLURM_PROCID", "five"}}));
  });
  EXPECT_TRUE(contains(message, "SLURM_PROCID=five"));
}

TEST(DetectEnvironment, SrunDirectLaunchWithPmiStaysSlurm) {
  // srun --mpi=pmi2 sets PMI_RANK/PMI_SIZE, but not the variables of an MPI launcher.
  auto environment = detect_environment(
      with(fixture("slurm_srun_rank5.env"), {{"PMI_RANK", "5"}, {"PMI_SIZE", "8"}}));
  EXPECT_EQ(environment->name(), "slurm");
  EXPECT_EQ(environment->global_rank(), 5);
}

TEST(ClusterEnvironment, DescribeSummarisesTheEnvironment) {
  auto environment = detect_environment(fixture("slurm_srun_rank5.env"));
  EXPECT_EQ(environment->describe(),
            "slurm: global rank 5 of 8, local rank 1, node rank 1, main gpu-a07:17137");
}

// Lightning's manual multi-node recipe (WORLD_SIZE, NODE_RANK, MASTER_ADDR, MASTER_PORT set on each
// node, the same command started there) is no half-set torchrun job: it is local, and this
// process starts its node's ranks.
TEST(DetectEnvironment, TheManualMultiNodeRecipeIsLocal) {
  const auto environment = detect_environment(fixture("lightning_manual_node1.env"));
  EXPECT_EQ(environment->name(), "local");
  EXPECT_FALSE(environment->creates_processes_externally());
  EXPECT_EQ(environment->node_rank(), 1);
  EXPECT_EQ(environment->world_size(), 8);
  EXPECT_EQ(environment->main_address(), "gpu-node01");
  EXPECT_EQ(environment->main_port(), 29500);
  environment->validate_settings(4, 2);
}

// WORLD_SIZE alone is still half-set, and the message names the recipe it may have come from.
TEST(DetectEnvironment, WorldSizeAloneNamesTheManualMultiNodeRecipe) {
  const std::string message = error_of([] {
    detect_environment(with(fixture("lightning_manual_node1.env"), {{"NODE_RANK", std::nullopt}}));
  });
  EXPECT_TRUE(contains(message, "WORLD_SIZE=8 is set")) << message;
  EXPECT_TRUE(contains(message, "To start each node yourself, as in Lightning, set NODE_RANK too, with MASTER_ADDR "
                                "and MASTER_PORT, and run the program once per node with --num-nodes N --devices "
                                "WORLD_SIZE/N."))
      << message;
}
