#include "lockstep/environments/lsf_environment.h"

#include <gtest/gtest.h>

#include "../../support/environment_fixtures.h"
#include "../../support/paths.h"

#include <cstdio>
#include <fstream>

using namespace lockstep::environments;
using lockstep::testing::contains;
using lockstep::testing::error_of;
using lockstep::testing::fixture;
using lockstep::testing::with;

namespace {

const std::string kRankfile =
    std::string(LOCKSTEP_SOURCE_DIR) + "/tests/fixtures/environments/lsf_job.rankfile";

// The recorded jsrun task, with its rank file pointed at the fixture.
Environ jsrun_task() {
  return with(fixture("lsf_jsrun_rank5.env"), {{"LSB_DJOB_RANKFILE", kRankfile}});
}

}  // namespace

TEST(LSFEnvironment, ReadsAJsrunTask) {
  LSFEnvironment environment(jsrun_task(), "h41n08");
  EXPECT_EQ(environment.name(), "lsf");
  EXPECT_TRUE(environment.creates_processes_externally());
  EXPECT_EQ(environment.world_size(), 8);
  EXPECT_EQ(environment.global_rank(), 5);
  EXPECT_EQ(environment.local_rank(), 1);
  EXPECT_EQ(environment.node_rank(), 1);
  EXPECT_EQ(environment.main_address(), "h41n07");
  // Lightning's rule: 10000 + LSB_JOBID % 1000, with LSB_JOBID=1677853.
  EXPECT_EQ(environment.main_port(), 10853);
  EXPECT_EQ(environment.hosts(), (std::vector<std::string>{"h41n07", "h41n08"}));
}

TEST(LSFEnvironment, MatchesHostsByShortName) {
  EXPECT_EQ(LSFEnvironment(jsrun_task(), "h41n07.summit.olcf.ornl.gov").node_rank(), 0);
}

TEST(LSFEnvironment, MasterAddrAndPortWin) {
  LSFEnvironment environment(with(jsrun_task(), {{"MASTER_ADDR", "10.41.0.7"},
                                                 {"MASTER_PORT", "29400"}}),
                             "h41n07");
  EXPECT_EQ(environment.main_address(), "10.41.0.7");
  EXPECT_EQ(environment.main_port(), 29400);
}

TEST(LSFEnvironment, Detect) {
  EXPECT_TRUE(LSFEnvironment::detect(jsrun_task()));
  EXPECT_TRUE(LSFEnvironment::detect(with(jsrun_task(), {{"JSM_NAMESPACE_RANK", std::nullopt}})));
  EXPECT_FALSE(LSFEnvironment::detect(with(jsrun_task(), {{"JSM_NAMESPACE_SIZE", std::nullopt}})));
  EXPECT_FALSE(LSFEnvironment::detect(with(jsrun_task(), {{"LSB_DJOB_RANKFILE", std::nullopt}})));
  EXPECT_FALSE(LSFEnvironment::detect(fixture("openmpi_two_nodes_rank6.env")));
}

TEST(LSFEnvironment, HostNotInTheRankFile) {
  std::string message = error_of([] { LSFEnvironment(jsrun_task(), "login1"); });
  EXPECT_TRUE(contains(message, "This host 'login1'"));
  EXPECT_TRUE(contains(message, kRankfile));
  EXPECT_TRUE(contains(message, "(h41n07, h41n08)"));
}

TEST(LSFEnvironment, UnreadableOrEmptyRankFile) {
  std::string message = error_of([] {
    LSFEnvironment(with(jsrun_task(), {{"LSB_DJOB_RANKFILE", "/nonexistent/.1677853.rankfile"}}),
                   "h41n08");
  });
  EXPECT_TRUE(contains(message, "Cannot read the LSF rank file"));
  EXPECT_TRUE(contains(message, "/nonexistent/.1677853.rankfile"));

  std::string launch_only = ::testing::TempDir() + "lockstep_launch_only.rankfile";
  std::ofstream(launch_only) << "batch3\n\n";
  message = error_of([&] { read_lsf_rankfile(launch_only); });
  EXPECT_TRUE(contains(message, "lists no compute host"));
  std::remove(launch_only.c_str());
}

TEST(LSFEnvironment, ReadsEverySlotOfTheRankFile) {
  auto hosts = read_lsf_rankfile(kRankfile);
  ASSERT_EQ(hosts.size(), 84u);
  EXPECT_EQ(hosts.front(), "h41n07");
  EXPECT_EQ(hosts.back(), "h41n08");
}

TEST(LSFEnvironment, MissingOrInvalidVariables) {
  std::string message = error_of(
      [] { LSFEnvironment(with(jsrun_task(), {{"JSM_NAMESPACE_RANK", std::nullopt}}), "h41n08"); });
  EXPECT_TRUE(contains(message, "JSM_NAMESPACE_RANK is not set"));
  EXPECT_TRUE(contains(message, "jsrun"));
  EXPECT_TRUE(contains(
      error_of([] { LSFEnvironment(with(jsrun_task(), {{"LSB_JOBID", "abc"}}), "h41n08"); }),
      "LSB_JOBID=abc"));
  EXPECT_TRUE(contains(
      error_of([] { LSFEnvironment(with(jsrun_task(), {{"JSM_NAMESPACE_RANK", "9"}}), "h41n08"); }),
      "JSM_NAMESPACE_RANK=9 is not below JSM_NAMESPACE_SIZE=8"));
}

TEST(LSFEnvironment, ValidateSettingsNamesTheFix) {
  LSFEnvironment environment(jsrun_task(), "h41n08");
  EXPECT_NO_THROW(environment.validate_settings(4, 2));
  std::string message = error_of([&] { environment.validate_settings(2, 2); });
  EXPECT_TRUE(contains(message, "JSM_NAMESPACE_SIZE=8"));
  EXPECT_TRUE(contains(message, "--devices"));
  EXPECT_TRUE(contains(message, "jsrun -n 4 -r 2"));
}
