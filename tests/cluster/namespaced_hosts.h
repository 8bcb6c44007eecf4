#pragma once
// A test fixture whose hosts are network namespaces on this machine (tests/cluster/nodes): each
// test makes the nodes it needs, and they are removed at its end whatever happens. Skipped, with
// the reason, where namespaces cannot be made.

#include <unistd.h>

#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <lockstep/launchers/worker_environment.h>

#include "../support/command.h"
#include "../support/paths.h"

namespace lockstep {
namespace testing {

inline const std::string& nodes_script() {
  static const std::string path = std::string(LOCKSTEP_SOURCE_DIR) + "/tests/cluster/nodes";
  return path;
}

inline std::map<std::string, std::string> cluster_environment() {
  return {{"PATH", "/usr/sbin:/usr/bin:/sbin:/bin"}, {"OMP_NUM_THREADS", "1"}, {"LOCKSTEP_NO_BLAS_WARNING", "1"}};
}

class NamespacedHosts : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const auto check = run_command({nodes_script(), "check"}, cluster_environment(), std::chrono::seconds(20));
    if (check.exit_code != 0) skip_reason() = "network namespaces cannot be made here: " + check.out + check.err;
  }
  static std::string& skip_reason() {
    static std::string reason;
    return reason;
  }

  void SetUp() override {
    if (!skip_reason().empty()) GTEST_SKIP() << skip_reason();
  }
  void TearDown() override {
    if (up_) nodes({"down", name_});
  }

  // N nodes, named after this process so that runs never share them.
  void make_nodes(int n) {
    nodes({"down", name_});  // leftovers of a killed run with the same pid
    const auto made = nodes({"up", name_, std::to_string(n)});
    up_ = true;
    ASSERT_EQ(made.exit_code, 0) << made.err;
  }
  std::string address(int node) {
    return run_command({nodes_script(), "addr", name_, std::to_string(node)}, cluster_environment()).out_lines().at(0);
  }
  CommandResult nodes(std::vector<std::string> args) {
    args.insert(args.begin(), nodes_script());
    return run_command(args, cluster_environment(), std::chrono::seconds(30));
  }
  // `program` run on node `node` ("nodes run").
  std::vector<std::string> on_node(int node, const std::vector<std::string>& program) const {
    std::vector<std::string> argv{nodes_script(), "run", name_, std::to_string(node)};
    argv.insert(argv.end(), program.begin(), program.end());
    return argv;
  }

  // Starts `program` under `lockstep launch` on each node (node r with procs[r] workers); returns
  // what each node's launcher said.
  std::vector<CommandResult> launch(const std::vector<int>& procs, const std::vector<std::string>& program,
                                    std::map<std::string, std::string> env = {},
                                    std::chrono::seconds timeout = std::chrono::seconds(120)) {
    const std::string port = std::to_string(launchers::find_free_port());
    for (const auto& [k, v] : cluster_environment()) env.emplace(k, v);
    std::vector<StartedCommand> started;
    for (size_t r = 0; r < procs.size(); ++r) {
      std::vector<std::string> argv{std::string(LOCKSTEP_BIN_DIR) + "/lockstep", "launch", "--nnodes",
                                    std::to_string(procs.size()), "--node-rank", std::to_string(r), "--nproc-per-node",
                                    std::to_string(procs[r]), "--master-addr", address(0), "--master-port", port,
                                    "--grace-period", "2", "--"};
      argv.insert(argv.end(), program.begin(), program.end());
      started.push_back(start_command(on_node(static_cast<int>(r), argv), env));
    }
    std::vector<CommandResult> results;
    for (const auto& s : started) results.push_back(finish_command(s, timeout));
    return results;
  }

  const std::string name_ = "ls" + std::to_string(::getpid() % 100000);
  bool up_ = false;
};

}  // namespace testing
}  // namespace lockstep
