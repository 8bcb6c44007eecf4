#include "lockstep/environments/torchelastic_environment.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "../../support/environment_fixtures.h"

using namespace lockstep::environments;
using lockstep::testing::contains;
using lockstep::testing::error_of;
using lockstep::testing::fixture;
using lockstep::testing::with;

TEST(TorchElasticEnvironment, ReadsARecordedTorchrunWorker) {
  // Recorded from `torchrun --nnodes=1 --nproc_per_node=2 --master_port=29511` (torch 1.13.1).
  TorchElasticEnvironment environment(fixture("torchrun_single_node_rank1.env"));
  EXPECT_EQ(environment.name(), "torchelastic");
  EXPECT_TRUE(environment.creates_processes_externally());
  EXPECT_EQ(environment.world_size(), 2);
  EXPECT_EQ(environment.global_rank(), 1);
  EXPECT_EQ(environment.local_rank(), 1);
  EXPECT_EQ(environment.local_world_size(), 2);
  EXPECT_EQ(environment.node_rank(), 0);
  EXPECT_EQ(environment.main_address(), "127.0.0.1");
  EXPECT_EQ(environment.main_port(), 29511);
  // torchrun's default static rendezvous: its agent hosts the store on MASTER_PORT.
  EXPECT_TRUE(environment.use_agent_store());
  EXPECT_EQ(environment.restart_count(), 0);
}

TEST(TorchElasticEnvironment, ReadsAWorkerOnTheSecondNode) {
  TorchElasticEnvironment environment(fixture("torchrun_two_nodes_rank5.env"));
  EXPECT_EQ(environment.world_size(), 8);
  EXPECT_EQ(environment.global_rank(), 5);
  EXPECT_EQ(environment.local_rank(), 1);
  EXPECT_EQ(environment.node_rank(), 1);
  EXPECT_EQ(environment.main_address(), "gpu-node01");
  EXPECT_EQ(environment.main_port(), 44517);
  // --rdzv_backend=c10d: the agent hands the workers a free MASTER_PORT for rank 0 to host.
  EXPECT_FALSE(environment.use_agent_store());
}

TEST(TorchElasticEnvironment, AgentStoreFollowsPyTorchsRule) {
  // torch/distributed/rendezvous.py: only the exact string "True" means the agent's store.
  Environ env = fixture("torchrun_single_node_rank1.env");
  const std::vector<std::pair<std::optional<std::string>, bool>> cases = {
      {"True", true}, {"False", false}, {"true", false}, {"1", false}, {std::nullopt, false}};
  for (const auto& [value, expected] : cases) {
    TorchElasticEnvironment environment(with(env, {{"TORCHELASTIC_USE_AGENT_STORE", value}}));
    EXPECT_EQ(environment.use_agent_store(), expected) << value.value_or("(unset)");
  }
  EXPECT_EQ(TorchElasticEnvironment(with(env, {{"TORCHELASTIC_RESTART_COUNT", "3"}})).restart_count(), 3);
  EXPECT_TRUE(contains(
      error_of([&] { TorchElasticEnvironment(with(env, {{"TORCHELASTIC_RESTART_COUNT", "x"}})); }),
      "TORCHELASTIC_RESTART_COUNT=x"));
  EXPECT_TRUE(contains(error_of([&] {
                         TorchElasticEnvironment(with(env, {{"TORCHELASTIC_RESTART_COUNT", std::nullopt}}));
                       }),
                       "TORCHELASTIC_RESTART_COUNT is not set"));
  // Without the agent's store the restart count only labels the attempt, and defaults to 0.
  EXPECT_EQ(TorchElasticEnvironment(with(env, {{"TORCHELASTIC_USE_AGENT_STORE", "False"},
                                               {"TORCHELASTIC_RESTART_COUNT", std::nullopt}}))
                .restart_count(),
            0);
}

TEST(TorchElasticEnvironment, DetectsOnLightningsFourVariables) {
  Environ env = fixture("torchrun_single_node_rank1.env");
  EXPECT_TRUE(TorchElasticEnvironment::detect(env));
  EXPECT_TRUE(TorchElasticEnvironment::detect(with(env, {{"WORLD_SIZE", std::nullopt}})));
  EXPECT_FALSE(TorchElasticEnvironment::detect(with(env, {{"GROUP_RANK", std::nullopt}})));
  EXPECT_FALSE(TorchElasticEnvironment::detect(with(env, {{"LOCAL_WORLD_SIZE", std::nullopt}})));
  EXPECT_FALSE(TorchElasticEnvironment::detect(fixture("laptop.env")));
  EXPECT_FALSE(TorchElasticEnvironment::detect(fixture("kubeflow_worker_rank2.env")));
}

TEST(TorchElasticEnvironment, MissingWorldSizeSaysHowToFixIt) {
  std::string message = error_of([] {
    TorchElasticEnvironment(
        with(fixture("torchrun_single_node_rank1.env"), {{"WORLD_SIZE", std::nullopt}}));
  });
  EXPECT_EQ(message,
            "RANK=1 is set but WORLD_SIZE is not: torchrun sets both; set WORLD_SIZE to the number "
            "of processes or unset RANK.");
}

TEST(TorchElasticEnvironment, MasterPortIsRequiredAndMasterAddrDefaults) {
  Environ env = fixture("torchrun_two_nodes_rank5.env");
  std::string message =
      error_of([&] { TorchElasticEnvironment(with(env, {{"MASTER_PORT", std::nullopt}})); });
  EXPECT_TRUE(contains(message, "MASTER_PORT is not set"));
  EXPECT_TRUE(contains(message, "--master_port"));
  EXPECT_EQ(TorchElasticEnvironment(with(env, {{"MASTER_ADDR", std::nullopt}})).main_address(),
            "127.0.0.1");
}

TEST(TorchElasticEnvironment, RejectsInconsistentRanks) {
  Environ env = fixture("torchrun_two_nodes_rank5.env");
  EXPECT_TRUE(contains(error_of([&] { TorchElasticEnvironment(with(env, {{"RANK", "8"}})); }),
                       "RANK=8 is not below WORLD_SIZE=8"));
  EXPECT_TRUE(
      contains(error_of([&] { TorchElasticEnvironment(with(env, {{"LOCAL_RANK", "4"}})); }),
               "LOCAL_RANK=4 is not below LOCAL_WORLD_SIZE=4"));
  EXPECT_TRUE(contains(
      error_of([&] { TorchElasticEnvironment(with(env, {{"LOCAL_WORLD_SIZE", "16"}})); }),
      "LOCAL_WORLD_SIZE=16 exceeds WORLD_SIZE=8"));
  EXPECT_TRUE(contains(error_of([&] { TorchElasticEnvironment(with(env, {{"GROUP_RANK", "x"}})); }),
                       "GROUP_RANK=x"));
}

TEST(TorchElasticEnvironment, ValidateSettingsMatchesDevicesAndNodes) {
  TorchElasticEnvironment environment(fixture("torchrun_two_nodes_rank5.env"));
  EXPECT_NO_THROW(environment.validate_settings(4, 2));

  std::string message = error_of([&] { environment.validate_settings(2, 2); });
  EXPECT_TRUE(contains(message, "--devices=2"));
  EXPECT_TRUE(contains(message, "LOCAL_WORLD_SIZE=4"));
  EXPECT_TRUE(contains(message, "Use --devices 4"));
  EXPECT_TRUE(contains(message, "torchrun --nproc_per_node=2"));

  message = error_of([&] { environment.validate_settings(4, 1); });
  EXPECT_TRUE(contains(message, "WORLD_SIZE=8"));
  EXPECT_TRUE(contains(message, "Use --num-nodes 2"));
  EXPECT_TRUE(contains(message, "torchrun --nnodes=1"));
}
