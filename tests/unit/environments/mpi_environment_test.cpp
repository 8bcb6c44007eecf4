#include "lockstep/environments/mpi_environment.h"

#include <gtest/gtest.h>

#include "../../support/environment_fixtures.h"

using namespace lockstep::environments;
using lockstep::testing::contains;
using lockstep::testing::error_of;
using lockstep::testing::fixture;
using lockstep::testing::with;
using Vars = std::map<std::string, std::string>;

TEST(MPIEnvironment, ReadsARecordedOpenMpiProcess) {
  // Recorded from `mpirun -np 4` (Open MPI 4.1.4, Debian 12). Its OMPI_COMM_WORLD_NODE_RANK=3
  // shows that variable is not a node index.
  MPIEnvironment environment(fixture("openmpi_single_node_rank3.env"));
  EXPECT_EQ(environment.name(), "mpi");
  EXPECT_EQ(environment.flavor(), "openmpi");
  EXPECT_TRUE(environment.creates_processes_externally());
  EXPECT_EQ(environment.world_size(), 4);
  EXPECT_EQ(environment.global_rank(), 3);
  EXPECT_EQ(environment.local_rank(), 3);
  EXPECT_EQ(environment.local_world_size(), 4);
  EXPECT_EQ(environment.node_rank(), 0);
  EXPECT_EQ(environment.main_address(), "127.0.0.1");
  EXPECT_EQ(environment.main_port(), 29500);
}

TEST(MPIEnvironment, DerivesTheNodeRankAcrossNodes) {
  MPIEnvironment environment(fixture("openmpi_two_nodes_rank6.env"));
  EXPECT_EQ(environment.world_size(), 8);
  EXPECT_EQ(environment.global_rank(), 6);
  EXPECT_EQ(environment.local_rank(), 2);
  EXPECT_EQ(environment.node_rank(), 1);
  EXPECT_EQ(environment.main_address(), "node01");
  EXPECT_EQ(environment.main_port(), 29610);
}

TEST(MPIEnvironment, ReadsHydraVariables) {
  MPIEnvironment environment(fixture("intel_mpi_rank5.env"));
  EXPECT_EQ(environment.flavor(), "mpich");
  EXPECT_EQ(environment.world_size(), 8);
  EXPECT_EQ(environment.global_rank(), 5);
  EXPECT_EQ(environment.local_rank(), 1);
  EXPECT_EQ(environment.node_rank(), 1);
  EXPECT_EQ(environment.main_address(), "icx-01");
  EXPECT_EQ(environment.main_port(), 29500);
}

TEST(MPIEnvironment, Detect) {
  EXPECT_TRUE(MPIEnvironment::detect(fixture("openmpi_single_node_rank3.env")));
  EXPECT_TRUE(MPIEnvironment::detect(fixture("intel_mpi_rank5.env")));
  EXPECT_TRUE(MPIEnvironment::detect(Environ(Vars{{"PMI_SIZE", "2"}})));
  EXPECT_FALSE(MPIEnvironment::detect(fixture("laptop.env")));
  EXPECT_FALSE(MPIEnvironment::detect(fixture("torchrun_single_node_rank1.env")));
}

TEST(MPIEnvironment, MultiNodeJobNeedsMasterAddr) {
  Environ env = with(fixture("openmpi_two_nodes_rank6.env"), {{"MASTER_ADDR", std::nullopt}});
  std::string message = error_of([&] { MPIEnvironment{env}; });
  EXPECT_TRUE(contains(message, "MASTER_ADDR is not set and the MPI job spans 2 nodes"));
  EXPECT_TRUE(contains(message, "mpirun -x MASTER_ADDR="));
  EXPECT_EQ(MPIEnvironment(with(env, {{"SLURM_JOB_NODELIST", "cpu-b[03-04]"}})).main_address(),
            "cpu-b03");
}

TEST(MPIEnvironment, HalfSetVariablesAreErrors) {
  std::string message = error_of([] { MPIEnvironment(Environ(Vars{{"PMI_RANK", "1"}})); });
  EXPECT_TRUE(contains(message, "PMI_SIZE is not set"));
  EXPECT_TRUE(contains(message, "mpirun -np N"));
  message = error_of([] {
    MPIEnvironment(with(fixture("intel_mpi_rank5.env"), {{"MPI_LOCALRANKID", std::nullopt}}));
  });
  EXPECT_TRUE(contains(message, "MPI_LOCALRANKID is not set"));
  message = error_of([] {
    MPIEnvironment(with(fixture("openmpi_single_node_rank3.env"),
                        {{"OMPI_COMM_WORLD_LOCAL_SIZE", std::nullopt}}));
  });
  EXPECT_TRUE(contains(message, "OMPI_COMM_WORLD_LOCAL_SIZE is not set"));
  EXPECT_TRUE(contains(error_of([] {
                         MPIEnvironment(with(fixture("openmpi_single_node_rank3.env"),
                                             {{"OMPI_COMM_WORLD_RANK", "4"}}));
                       }),
                       "OMPI_COMM_WORLD_RANK=4 is not below OMPI_COMM_WORLD_SIZE=4"));
}

TEST(MPIEnvironment, RoundRobinPlacementIsAnError) {
  // mpirun --map-by node: rank 6 is local rank 3 of 4 on the second of two nodes.
  std::string message = error_of([] {
    MPIEnvironment(with(fixture("openmpi_two_nodes_rank6.env"),
                        {{"OMPI_COMM_WORLD_LOCAL_RANK", "3"}}));
  });
  EXPECT_TRUE(contains(message, "OMPI_COMM_WORLD_RANK=6, OMPI_COMM_WORLD_LOCAL_RANK=3"));
  EXPECT_TRUE(contains(message, "not --map-by node"));
}

TEST(MPIEnvironment, ValidateSettingsNamesTheFix) {
  MPIEnvironment environment(fixture("openmpi_two_nodes_rank6.env"));
  EXPECT_NO_THROW(environment.validate_settings(4, 2));
  std::string message = error_of([&] { environment.validate_settings(2, 2); });
  EXPECT_TRUE(contains(message, "OMPI_COMM_WORLD_LOCAL_SIZE=4"));
  EXPECT_TRUE(contains(message, "Use --devices 4, or mpirun -npernode 2"));
  message = error_of([&] { environment.validate_settings(4, 1); });
  EXPECT_TRUE(contains(message, "Use --num-nodes 2"));
  EXPECT_TRUE(contains(message, "mpirun -np 4"));
  MPIEnvironment hydra(fixture("intel_mpi_rank5.env"));
  EXPECT_TRUE(contains(error_of([&] { hydra.validate_settings(2, 2); }), "mpiexec -ppn 2"));
}
