#include "lockstep/environments/local_environment.h"

#include <gtest/gtest.h>

#include "../../support/environment_fixtures.h"

using namespace lockstep::environments;
using lockstep::testing::contains;
using lockstep::testing::error_of;
using lockstep::testing::fixture;
using lockstep::testing::with;

TEST(LocalEnvironment, DefaultsOnAPlainShell) {
  LocalEnvironment environment(fixture("laptop.env"));
  EXPECT_EQ(environment.name(), "local");
  EXPECT_FALSE(environment.creates_processes_externally());
  EXPECT_EQ(environment.main_address(), "127.0.0.1");
  EXPECT_GE(environment.main_port(), 1);
  EXPECT_LE(environment.main_port(), 65535);
  EXPECT_EQ(environment.world_size(), 1);
  EXPECT_EQ(environment.global_rank(), 0);
  EXPECT_EQ(environment.local_rank(), 0);
  EXPECT_EQ(environment.node_rank(), 0);
  EXPECT_TRUE(LocalEnvironment::detect(fixture("laptop.env")));
}

TEST(LocalEnvironment, FreePortIsFoundOnceAtConstruction) {
  LocalEnvironment environment(fixture("laptop.env"));
  int port = environment.main_port();
  EXPECT_EQ(environment.main_port(), port);
  EXPECT_EQ(environment.main_port(), port);
}

TEST(LocalEnvironment, ReadsTheVariablesThatAreSet) {
  LocalEnvironment environment(with(fixture("laptop.env"), {{"MASTER_ADDR", "10.0.0.5"},
                                                            {"MASTER_PORT", "29777"},
                                                            {"WORLD_SIZE", "8"},
                                                            {"RANK", "6"},
                                                            {"LOCAL_RANK", "2"},
                                                            {"NODE_RANK", "1"}}));
  EXPECT_EQ(environment.main_address(), "10.0.0.5");
  EXPECT_EQ(environment.main_port(), 29777);
  EXPECT_EQ(environment.world_size(), 8);
  EXPECT_EQ(environment.global_rank(), 6);
  EXPECT_EQ(environment.local_rank(), 2);
  EXPECT_EQ(environment.node_rank(), 1);
}

TEST(LocalEnvironment, NodeRankFallsBackToGroupRank) {
  EXPECT_EQ(LocalEnvironment(with(fixture("laptop.env"), {{"GROUP_RANK", "3"}})).node_rank(), 3);
  EXPECT_EQ(LocalEnvironment(with(fixture("laptop.env"), {{"GROUP_RANK", "3"}, {"NODE_RANK", "2"}}))
                .node_rank(),
            2);
}

TEST(LocalEnvironment, RejectsARankOutsideTheWorld) {
  std::string message = error_of([] {
    LocalEnvironment(with(fixture("laptop.env"), {{"RANK", "4"}, {"WORLD_SIZE", "4"}}));
  });
  EXPECT_TRUE(contains(message, "RANK=4 is not below WORLD_SIZE=4"));
  EXPECT_TRUE(contains(
      error_of([] { LocalEnvironment(with(fixture("laptop.env"), {{"RANK", "1"}})); }),
      "RANK=1 is set but WORLD_SIZE is not"));
}

TEST(LocalEnvironment, RejectsInvalidValues) {
  EXPECT_TRUE(contains(
      error_of([] { LocalEnvironment(with(fixture("laptop.env"), {{"WORLD_SIZE", "0"}})); }),
      "WORLD_SIZE=0"));
  EXPECT_TRUE(contains(
      error_of([] {
        LocalEnvironment(with(fixture("laptop.env"), {{"RANK", "abc"}, {"WORLD_SIZE", "2"}}));
      }),
      "RANK=abc is not a non-negative integer"));
  EXPECT_TRUE(contains(
      error_of([] { LocalEnvironment(with(fixture("laptop.env"), {{"MASTER_PORT", "0"}})); }),
      "MASTER_PORT=0"));
  EXPECT_TRUE(contains(
      error_of([] { LocalEnvironment(with(fixture("laptop.env"), {{"MASTER_ADDR", ""}})); }),
      "MASTER_ADDR is set but empty"));
}

TEST(LocalEnvironment, ValidateSettingsAcceptsAnything) {
  LocalEnvironment environment(fixture("laptop.env"));
  EXPECT_NO_THROW(environment.validate_settings(4, 1));
  EXPECT_NO_THROW(environment.validate_settings(1, 3));
}

TEST(LocalEnvironment, FindFreePortReturnsAPort) {
  int port = find_free_port();
  EXPECT_GT(port, 0);
  EXPECT_LE(port, 65535);
}
