#include "lockstep/environments/kubeflow_environment.h"

#include <gtest/gtest.h>

#include "../../support/environment_fixtures.h"

using namespace lockstep::environments;
using lockstep::testing::contains;
using lockstep::testing::error_of;
using lockstep::testing::fixture;
using lockstep::testing::with;

TEST(KubeflowEnvironment, ReadsAPyTorchJobWorker) {
  KubeflowEnvironment environment(fixture("kubeflow_worker_rank2.env"));
  EXPECT_EQ(environment.name(), "kubeflow");
  EXPECT_TRUE(environment.creates_processes_externally());
  EXPECT_EQ(environment.world_size(), 4);
  EXPECT_EQ(environment.global_rank(), 2);
  EXPECT_EQ(environment.local_rank(), 0);
  EXPECT_EQ(environment.node_rank(), 2);
  EXPECT_EQ(environment.main_address(), "fmnist-master-0");
  EXPECT_EQ(environment.main_port(), 23456);
}

TEST(KubeflowEnvironment, DetectNeedsAllFiveVariables) {
  Environ env = fixture("kubeflow_worker_rank2.env");
  EXPECT_TRUE(KubeflowEnvironment::detect(env));
  for (const char* name : {"KUBERNETES_PORT", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK"}) {
    EXPECT_FALSE(KubeflowEnvironment::detect(with(env, {{name, std::nullopt}}))) << name;
  }
}

TEST(KubeflowEnvironment, TorchrunInsideAPodIsTorchelastic) {
  Environ env = fixture("kubeflow_torchrun_rank5.env");
  EXPECT_TRUE(KubeflowEnvironment::detect(env));
  auto environment = detect_environment(env);
  EXPECT_EQ(environment->name(), "torchelastic");
  EXPECT_EQ(environment->global_rank(), 5);
  EXPECT_EQ(environment->world_size(), 8);
}

TEST(KubeflowEnvironment, RejectsInvalidValues) {
  Environ env = fixture("kubeflow_worker_rank2.env");
  EXPECT_TRUE(contains(error_of([&] { KubeflowEnvironment(with(env, {{"RANK", "4"}})); }),
                       "RANK=4 is not below WORLD_SIZE=4"));
  EXPECT_TRUE(contains(error_of([&] { KubeflowEnvironment(with(env, {{"MASTER_PORT", "abc"}})); }),
                       "MASTER_PORT=abc"));
  std::string message =
      error_of([&] { KubeflowEnvironment(with(env, {{"MASTER_ADDR", std::nullopt}})); });
  EXPECT_TRUE(contains(message, "MASTER_ADDR is not set"));
  EXPECT_TRUE(contains(message, "pod spec"));
}

TEST(KubeflowEnvironment, ValidateSettingsNamesTheFix) {
  KubeflowEnvironment environment(fixture("kubeflow_worker_rank2.env"));
  EXPECT_NO_THROW(environment.validate_settings(1, 4));
  std::string message = error_of([&] { environment.validate_settings(2, 4); });
  EXPECT_TRUE(contains(message, "Use --devices 1"));
  EXPECT_TRUE(contains(message, "torchrun --nproc_per_node=2"));
  message = error_of([&] { environment.validate_settings(1, 1); });
  EXPECT_TRUE(contains(message, "WORLD_SIZE=4"));
  EXPECT_TRUE(contains(message, "Use --num-nodes 4"));
}
