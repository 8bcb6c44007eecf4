#include "lockstep/environments/slurm_environment.h"

#include <gtest/gtest.h>

#include "../../support/environment_fixtures.h"

using namespace lockstep::environments;
using lockstep::testing::contains;
using lockstep::testing::error_of;
using lockstep::testing::fixture;
using lockstep::testing::with;

TEST(SLURMEnvironment, ReadsAnSrunTask) {
  SLURMEnvironment environment(fixture("slurm_srun_rank5.env"));
  EXPECT_EQ(environment.name(), "slurm");
  EXPECT_TRUE(environment.creates_processes_externally());
  EXPECT_EQ(environment.world_size(), 8);
  EXPECT_EQ(environment.global_rank(), 5);
  EXPECT_EQ(environment.local_rank(), 1);
  EXPECT_EQ(environment.node_rank(), 1);
  EXPECT_EQ(environment.main_address(), "gpu-a07");
  // Lightning's rule: 15000 + the last 4 characters of SLURM_JOB_ID=4242137.
  EXPECT_EQ(environment.main_port(), 17137);
}

TEST(SLURMEnvironment, MasterAddrAndPortWin) {
  SLURMEnvironment environment(with(fixture("slurm_srun_rank5.env"),
                                    {{"MASTER_ADDR", "10.20.1.7"}, {"MASTER_PORT", "23000"}}));
  EXPECT_EQ(environment.main_address(), "10.20.1.7");
  EXPECT_EQ(environment.main_port(), 23000);
}

TEST(SLURMEnvironment, PortFromJobId) {
  Environ env = fixture("slurm_srun_rank5.env");
  EXPECT_EQ(SLURMEnvironment(with(env, {{"SLURM_JOB_ID", "123"}})).main_port(), 15123);
  EXPECT_EQ(SLURMEnvironment(with(env, {{"SLURM_JOB_ID", "90000"}})).main_port(), 15000);
  EXPECT_EQ(SLURMEnvironment(with(env, {{"SLURM_JOB_ID", std::nullopt}})).main_port(), 12910);
  EXPECT_TRUE(contains(
      error_of([&] { SLURMEnvironment(with(env, {{"SLURM_JOB_ID", "12_ab"}})); }),
      "MASTER_PORT"));
}

TEST(SLURMEnvironment, DetectIgnoresInteractiveJobs) {
  Environ env = fixture("slurm_srun_rank5.env");
  EXPECT_TRUE(SLURMEnvironment::detect(env));
  EXPECT_FALSE(SLURMEnvironment::detect(fixture("slurm_interactive_bash.env")));
  EXPECT_FALSE(SLURMEnvironment::detect(with(env, {{"SLURM_JOB_NAME", "interactive"}})));
  EXPECT_TRUE(SLURMEnvironment::is_interactive(with(env, {{"SLURM_JOB_NAME", "bash"}})));
  EXPECT_FALSE(SLURMEnvironment::detect(with(env, {{"SLURM_NTASKS", std::nullopt}})));
  EXPECT_FALSE(SLURMEnvironment::detect(fixture("laptop.env")));
}

TEST(SLURMEnvironment, MissingTaskVariablesSayToUseSrun) {
  std::string message = error_of([] {
    SLURMEnvironment(with(fixture("slurm_srun_rank5.env"), {{"SLURM_PROCID", std::nullopt}}));
  });
  EXPECT_TRUE(contains(message, "SLURM_PROCID is not set"));
  EXPECT_TRUE(contains(message, "srun --ntasks-per-node"));
  EXPECT_TRUE(contains(message, "SLURM_JOB_NAME=interactive"));
  EXPECT_TRUE(contains(error_of([] {
                         SLURMEnvironment(
                             with(fixture("slurm_srun_rank5.env"), {{"SLURM_PROCID", "8"}}));
                       }),
                       "SLURM_PROCID=8 is not below SLURM_NTASKS=8"));
  EXPECT_TRUE(contains(error_of([] {
                         SLURMEnvironment(
                             with(fixture("slurm_srun_rank5.env"), {{"SLURM_NODEID", "2"}}));
                       }),
                       "SLURM_NODEID=2 is not below SLURM_NNODES=2"));
}

TEST(SLURMEnvironment, NodeListPrecedence) {
  Environ env = with(fixture("slurm_srun_rank5.env"),
                     {{"SLURM_STEP_NODELIST", "gpu-a[08]"}, {"SLURM_NODELIST", "gpu-a[07-08]"}});
  EXPECT_EQ(SLURMEnvironment(env).main_address(), "gpu-a08");
  env = with(env, {{"SLURM_STEP_NODELIST", std::nullopt}, {"SLURM_NODELIST", std::nullopt},
                   {"SLURM_JOB_NODELIST", "gpu-b[3,1]"}});
  EXPECT_EQ(SLURMEnvironment(env).main_address(), "gpu-b3");
  env = with(env, {{"SLURM_JOB_NODELIST", std::nullopt}});
  EXPECT_TRUE(contains(error_of([&] { SLURMEnvironment(with(env, {})); }), "set MASTER_ADDR"));
  EXPECT_EQ(SLURMEnvironment(with(env, {{"SLURM_NNODES", "1"}, {"SLURM_NODEID", "0"}}))
                .main_address(),
            "127.0.0.1");
}

TEST(SLURMEnvironment, MalformedNodeListIsAnError) {
  std::string message = error_of([] {
    SLURMEnvironment(with(fixture("slurm_srun_rank5.env"), {{"SLURM_STEP_NODELIST", "gpu-a[07-"}}));
  });
  EXPECT_TRUE(contains(message, "gpu-a[07-"));
  EXPECT_TRUE(contains(message, "MASTER_ADDR"));
}

TEST(SLURMEnvironment, ValidateSettingsNamesTheFix) {
  SLURMEnvironment environment(fixture("slurm_srun_rank5.env"));
  EXPECT_NO_THROW(environment.validate_settings(4, 2));

  std::string message = error_of([&] { environment.validate_settings(2, 2); });
  EXPECT_TRUE(contains(message, "You set --devices=2 but SLURM_NTASKS_PER_NODE=4"));
  EXPECT_TRUE(contains(message, "Use --devices 4, or srun --ntasks-per-node=2"));

  message = error_of([&] { environment.validate_settings(4, 1); });
  EXPECT_TRUE(contains(message, "SLURM_STEP_NUM_NODES=2"));
  EXPECT_TRUE(contains(message, "Use --num-nodes 2, or srun --nodes=1"));

  SLURMEnvironment job_counts(with(fixture("slurm_srun_rank5.env"),
                                   {{"SLURM_STEP_NUM_NODES", std::nullopt}}));
  EXPECT_TRUE(contains(error_of([&] { job_counts.validate_settings(4, 3); }), "SLURM_NNODES=2"));

  // sbatch --ntasks=8 without --ntasks-per-node: only the total can be checked.
  SLURMEnvironment ntasks_only(with(fixture("slurm_srun_rank5.env"),
                                    {{"SLURM_NTASKS_PER_NODE", std::nullopt},
                                     {"SLURM_NNODES", std::nullopt},
                                     {"SLURM_STEP_NUM_NODES", std::nullopt}}));
  EXPECT_NO_THROW(ntasks_only.validate_settings(8, 1));
  message = error_of([&] { ntasks_only.validate_settings(2, 2); });
  EXPECT_TRUE(contains(message, "SLURM_NTASKS=8"));
  EXPECT_TRUE(contains(message, "srun --ntasks-per-node=2 --nodes=2"));
}

TEST(SlurmNodeList, ExpandsRangesListsAndPadding) {
  EXPECT_EQ(expand_slurm_nodelist("node[01-03,7],gpu-a"),
            (std::vector<std::string>{"node01", "node02", "node03", "node7", "gpu-a"}));
  EXPECT_EQ(expand_slurm_nodelist("a,b"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(expand_slurm_nodelist("host-[5-9]x"),
            (std::vector<std::string>{"host-5x", "host-6x", "host-7x", "host-8x", "host-9x"}));
  EXPECT_EQ(expand_slurm_nodelist("n[8-10]"), (std::vector<std::string>{"n8", "n9", "n10"}));
  EXPECT_EQ(expand_slurm_nodelist("n[098-101]"),
            (std::vector<std::string>{"n098", "n099", "n100", "n101"}));
  EXPECT_EQ(expand_slurm_nodelist("r[1-2]n[1-2]"),
            (std::vector<std::string>{"r1n1", "r1n2", "r2n1", "r2n2"}));
  EXPECT_EQ(expand_slurm_nodelist("host0 host1  host3"),
            (std::vector<std::string>{"host0", "host1", "host3"}));
  EXPECT_EQ(expand_slurm_nodelist("gpu-a[07-08], cpu[1]"),
            (std::vector<std::string>{"gpu-a07", "gpu-a08", "cpu1"}));
  EXPECT_EQ(expand_slurm_nodelist("single"), (std::vector<std::string>{"single"}));
}

TEST(SlurmNodeList, FirstHost) {
  EXPECT_EQ(first_slurm_host("node[01-03,7],gpu-a"), "node01");
  EXPECT_EQ(first_slurm_host("a,b"), "a");
  EXPECT_EQ(first_slurm_host("host-[5-9]x"), "host-5x");
  EXPECT_EQ(first_slurm_host("r[3-4]n[009-010]"), "r3n009");
  EXPECT_EQ(first_slurm_host("host0 host1"), "host0");
  EXPECT_EQ(first_slurm_host("n[0-999999]"), "n0");  // not expanded
  // It refuses what expand_slurm_nodelist refuses (found by tests/fuzz/slurm_nodelist_fuzz.cpp).
  for (const char* too_many : {"n[0-99999999]", "noa[5-2100404,7]"}) {
    try {
      first_slurm_host(too_many);
      ADD_FAILURE() << too_many << " was taken";
    } catch (const EnvironmentError& e) {
      EXPECT_NE(std::string(e.what()).find("it expands to more than 1000000 hosts"), std::string::npos) << e.what();
    }
  }
}

TEST(SlurmNodeList, MalformedListsAreErrors) {
  struct Case {
    const char* nodelist;
    const char* says;
  };
  const Case cases[] = {
      {"node[1-3", "never closed"},
      {"node1-3]", "has no '['"},
      {"node[5-2]", "runs backwards (write 2-5)"},
      {"node[]", "empty range"},
      {"node[1,,3]", "empty range"},
      {"node[a-b]", "not a number or range"},
      {"node[1-]", "bad range"},
      {"node[1-[2]]", "nested '['"},
      {"a,,b", "empty entry"},
      {",a", "empty entry"},
      {"a,", "empty entry after the last ','"},
      {"", "no host"},
      {"n[0-99999999]", "more than 1000000 hosts"},
  };
  for (const Case& c : cases) {
    std::string message = error_of([&] { expand_slurm_nodelist(c.nodelist); });
    EXPECT_TRUE(contains(message, c.says)) << "nodelist '" << c.nodelist << "'";
    EXPECT_TRUE(contains(message, std::string("'") + c.nodelist + "'"));
  }
  EXPECT_TRUE(contains(error_of([] { first_slurm_host("a,[3-1]"); }), "runs backwards"));
}
