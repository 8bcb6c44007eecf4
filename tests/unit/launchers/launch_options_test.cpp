#include <lockstep/launchers/launch_error.h>
#include <lockstep/launchers/launch_options.h>

#include <unistd.h>

#include <ostream>
#include <string>

#include <gtest/gtest.h>

namespace lockstep {
namespace launchers {
namespace {

// The message of the LaunchError that validate() throws, or "" when it throws none.
std::string validation_error(const LaunchOptions& options) {
  try {
    options.validate();
  } catch (const LaunchError& error) {
    return error.what();
  }
  return "";
}

TEST(launch_options, DefaultsMatchTorchrunAndAreValid) {
  const LaunchOptions options;
  EXPECT_EQ(options.nproc_per_node(), 1);
  EXPECT_EQ(options.nnodes(), 1);
  EXPECT_EQ(options.node_rank(), 0);
  EXPECT_EQ(options.master_addr(), "127.0.0.1");
  EXPECT_EQ(options.master_port(), 0);
  EXPECT_EQ(options.grace_period(), std::chrono::milliseconds(5000));
  EXPECT_EQ(options.run_id(), "lockstep-" + std::to_string(::getpid()));
  EXPECT_EQ(options.log_dir(), "");
  EXPECT_EQ(options.exit_timeout(), std::chrono::milliseconds(60000));
  EXPECT_EQ(options.max_restarts(), 0);
  EXPECT_EQ(validation_error(options), "");
}

TEST(launch_options, SettersChainAndMultiNodeWithPortIsValid) {
  const auto options = LaunchOptions()
                           .nproc_per_node(4)
                           .nnodes(2)
                           .node_rank(1)
                           .master_addr("10.0.0.1")
                           .master_port(29500)
                           .grace_period(std::chrono::milliseconds(250))
                           .run_id("job7")
                           .log_dir("/tmp/x")
                           .exit_timeout(std::chrono::milliseconds(10))
                           .max_restarts(0);
  EXPECT_EQ(options.nproc_per_node(), 4);
  EXPECT_EQ(options.nnodes(), 2);
  EXPECT_EQ(options.node_rank(), 1);
  EXPECT_EQ(options.master_addr(), "10.0.0.1");
  EXPECT_EQ(options.master_port(), 29500);
  EXPECT_EQ(options.grace_period(), std::chrono::milliseconds(250));
  EXPECT_EQ(options.run_id(), "job7");
  EXPECT_EQ(options.log_dir(), "/tmp/x");
  EXPECT_EQ(options.exit_timeout(), std::chrono::milliseconds(10));
  EXPECT_EQ(options.world_size(), 8);
  EXPECT_EQ(validation_error(options), "");
  EXPECT_EQ(validation_error(LaunchOptions().nproc_per_node(2).max_restarts(3)), "");
  EXPECT_EQ(LaunchOptions().max_restarts(3).max_restarts(), 3);
}

struct BadOptions {
  const char* what;
  LaunchOptions options;
  std::vector<std::string> message_parts;  // what was wrong, what was given, how to fix it
};

// Names the test cases (gtest and ctest print parameters with it).
void PrintTo(const BadOptions& bad, std::ostream* out) { *out << bad.what; }

class launch_options_rejects : public ::testing::TestWithParam<BadOptions> {};

TEST_P(launch_options_rejects, WithAMessageThatTellsTheFix) {
  const std::string message = validation_error(GetParam().options);
  ASSERT_FALSE(message.empty()) << GetParam().what << " was accepted";
  for (const auto& part : GetParam().message_parts) {
    EXPECT_NE(message.find(part), std::string::npos)
        << GetParam().what << ": '" << part << "' missing from: " << message;
  }
}

INSTANTIATE_TEST_SUITE_P(
    launch_options, launch_options_rejects,
    ::testing::Values(
        BadOptions{"nproc_0", LaunchOptions().nproc_per_node(0),
                   {"nproc_per_node=0", "at least 1", "--nproc-per-node"}},
        BadOptions{"nnodes_0", LaunchOptions().nnodes(0), {"nnodes=0", "--nnodes"}},
        BadOptions{"node_rank_is_nnodes",
                   LaunchOptions().nnodes(2).node_rank(2).master_port(29500),
                   {"node_rank=2", "nnodes=2", "0 to 1", "--node-rank"}},
        BadOptions{"negative_node_rank", LaunchOptions().node_rank(-1), {"node_rank=-1"}},
        BadOptions{"port_too_big", LaunchOptions().master_port(70000),
                   {"master_port=70000", "1..65535", "--master-port"}},
        BadOptions{"negative_port", LaunchOptions().master_port(-1), {"master_port=-1"}},
        BadOptions{"free_port_on_two_nodes", LaunchOptions().nnodes(2),
                   {"master_port=0", "nnodes=2", "same", "--master-port"}},
        BadOptions{"empty_address", LaunchOptions().master_addr(""), {"master_addr", "--master-addr"}},
        BadOptions{"empty_run_id", LaunchOptions().run_id(""), {"run_id"}},
        BadOptions{"negative_grace", LaunchOptions().grace_period(std::chrono::milliseconds(-1)),
                   {"grace_period=-1", "SIGKILL"}},
        BadOptions{"negative_exit_timeout",
                   LaunchOptions().exit_timeout(std::chrono::milliseconds(-5)),
                   {"exit_timeout=-5"}},
        BadOptions{"negative_max_restarts", LaunchOptions().max_restarts(-1),
                   {"max_restarts=-1", "0 or more", "--max-restarts"}},
        BadOptions{"restarts_on_two_nodes", LaunchOptions().nnodes(2).master_port(29500).max_restarts(1),
                   {"max_restarts=1", "nnodes=2", "--nnodes 1", "elastic rendezvous"}}));

TEST(launch_options, LaunchErrorIsARuntimeError) {
  EXPECT_THROW(LaunchOptions().nproc_per_node(0).validate(), std::runtime_error);
}

}  // namespace
}  // namespace launchers
}  // namespace lockstep
