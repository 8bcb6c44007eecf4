// Jobs across several hosts, all inside this machine: each node is a network namespace with its
// own address, PID and UTS namespaces and a hostname that resolves to 127.0.1.1 (as on Debian),
// made by tests/cluster/nodes. On each node `lockstep launch --nnodes N --node-rank R` starts the
// node's workers, as on real machines. Skipped, with the reason, where namespaces cannot be made.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <thread>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <lockstep/launchers/worker_environment.h>

#include "namespaced_hosts.h"
#include "../support/command.h"
#include "../support/paths.h"
#include "../support/temp_dir.h"
#include "../support/written_parameters.h"

namespace lockstep {
namespace hosts_test {
namespace {

const std::string bin = LOCKSTEP_BIN_DIR;
const std::string trainer_program = bin + "/../tests/trainer_program";
const std::string& nodes_script = testing::nodes_script();
std::map<std::string, std::string> environment() { return testing::cluster_environment(); }

using Hosts = testing::NamespacedHosts;

using testing::max_diff;
using testing::written_parameters;

std::string all_output(const std::vector<testing::CommandResult>& results) {
  std::string text;
  for (size_t r = 0; r < results.size(); ++r) {
    text += "--- node " + std::to_string(r) + " (exit " + std::to_string(results[r].exit_code) + ")\n" + results[r].out +
            results[r].err;
  }
  return text;
}

// trainer_program with Adam for `epochs` epochs, writing into DIR/NAME.
std::vector<std::string> trainer(const testing::TempDir& dir, const std::string& name, int devices, int num_nodes,
                                 int batch_size, int epochs = 2, int timeout_s = 30) {
  std::filesystem::create_directories(dir / name);
  return {trainer_program, "--out", dir / name, "--default-root-dir", dir / (name + "_runs"),
          "--timeout", std::to_string(timeout_s), "--devices", std::to_string(devices),
          "--num-nodes", std::to_string(num_nodes), "--strategy", "ddp", "--batch-size", std::to_string(batch_size),
          "--max-epochs", std::to_string(epochs), "--adam"};
}

// 2 nodes x 2 workers train the same parameters as 1 process on the 4x batch, without being told
// which interface connects the nodes (their hostnames resolve to loopback).
TEST_F(Hosts, TwoNodesOfTwoEqualOneProcessOnTheWholeBatch) {
  make_nodes(2);
  testing::TempDir dir("lockstep_hosts");
  const auto single = testing::run_command(trainer(dir, "single", 1, 1, 32), environment(), std::chrono::seconds(60));
  ASSERT_EQ(single.exit_code, 0) << single.err;
  const auto results = launch({2, 2}, trainer(dir, "nodes", 2, 2, 8));
  for (const auto& r : results) ASSERT_EQ(r.exit_code, 0) << all_output(results);
  const auto one = written_parameters(dir / "single"), four = written_parameters(dir / "nodes");
  ASSERT_EQ(one.size(), 1u);
  ASSERT_EQ(four.size(), 4u) << "every rank writes its parameters: " << all_output(results);
  for (int r = 1; r < 4; ++r) EXPECT_EQ(max_diff(four[0], four[r]), 0.0) << "rank " << r << " drifted";
  const double diff = max_diff(four[0], one[0]);
  std::cout << "[ parity ] 2 nodes x 2 vs 1 process: max diff " << diff << "\n";
  EXPECT_LE(diff, 1e-6);
}

// Gradients travel through shared memory within each node and over Gloo across the nodes: every
// rank says so, and the job's loss equals the one-host job's.
TEST_F(Hosts, GradientsCrossHostsOverGlooAndStayInSharedMemoryWithin) {
  make_nodes(2);
  const std::vector<std::string> bench{bin + "/bench_ddp", "--model", "small", "--steps", "3", "--warmup", "1"};
  const auto results = launch({2, 2}, bench);
  for (const auto& r : results) ASSERT_EQ(r.exit_code, 0) << all_output(results);
  const auto report = nlohmann::json::parse(results[0].out_lines().back());
  EXPECT_EQ(report["world_size"], 4);
  ASSERT_EQ(report["gradient_transport_by_rank"].size(), 4u) << report.dump();
  for (const auto& t : report["gradient_transport_by_rank"]) {
    EXPECT_EQ(t, "shared memory within each host, gloo across 2 hosts") << report.dump();
  }
  std::vector<std::string> one_host{bench[0], "--nproc-per-node", "4"};
  one_host.insert(one_host.end(), bench.begin() + 1, bench.end());
  const auto local = testing::run_command(one_host, environment(), std::chrono::seconds(60));
  ASSERT_EQ(local.exit_code, 0) << local.err;
  const auto local_report = nlohmann::json::parse(local.out_lines().back());
  EXPECT_EQ(local_report["gradient_transport"], "shared memory");
  EXPECT_NEAR(report["loss"].get<double>(), local_report["loss"].get<double>(), 1e-6);
}

// Open MPI starts the same 2 x 2 job across the nodes (its remote shell is `nodes rsh`, where a
// cluster has ssh): Lockstep reads the ranks from Open MPI and trains to the same bits.
TEST_F(Hosts, MpirunAcrossTheNodesTrainsAsLockstepLaunchDoes) {
  make_nodes(2);
  const std::vector<std::string> bench{bin + "/bench_ddp", "--model", "small", "--steps", "3", "--warmup", "1"};
  const auto launched = launch({2, 2}, bench);
  for (const auto& r : launched) ASSERT_EQ(r.exit_code, 0) << all_output(launched);
  testing::TempDir session("lockstep_mpirun");
  std::vector<std::string> argv{nodes_script, "run", name_, "0", "mpirun", "--allow-run-as-root", "--oversubscribe",
                                "--host", "node0:2,node1:2", "-np", "4",
                                "--mca", "plm_rsh_agent", nodes_script + " rsh " + name_,
                                "--mca", "oob_tcp_if_include", "eth0",
                                // its own session folder: another mpirun may start beside it
                                "--mca", "orte_tmpdir_base", session.path(),
                                "-x", "MASTER_ADDR=" + address(0), "-x", "MASTER_PORT=29500", "-x", "OMP_NUM_THREADS=1"};
  argv.insert(argv.end(), bench.begin(), bench.end());
  const auto mpi = testing::run_command(argv, environment(), std::chrono::seconds(120));
  ASSERT_EQ(mpi.exit_code, 0) << mpi.out << mpi.err;
  const auto a = nlohmann::json::parse(launched[0].out_lines().back()), b = nlohmann::json::parse(mpi.out_lines().back());
  EXPECT_EQ(b["world_size"], 4);
  EXPECT_EQ(b["gradient_transport_by_rank"], a["gradient_transport_by_rank"]) << b.dump();
  EXPECT_EQ(b["loss"], a["loss"]) << "mpirun's job and lockstep launch's differ";
}

// `lockstep env` on a node names the interface Gloo takes, and why.
TEST_F(Hosts, EnvNamesTheInterfaceThatRoutesToTheMainAddress) {
  make_nodes(2);
  const auto env_on = [&](int node, const std::map<std::string, std::string>& env) {
    const auto results = launch({1, 1}, {bin + "/lockstep", "env", "--json", "--num-nodes", "2"}, env,
                                std::chrono::seconds(60));
    EXPECT_EQ(results[node].exit_code, 0) << all_output(results);
    return nlohmann::json::parse(results[node].out_lines().at(0))["gloo_interface"].get<std::string>();
  };
  EXPECT_EQ(env_on(1, {}), "eth0 (" + address(1) + "; routes to " + address(0) + ")");
  EXPECT_EQ(env_on(0, {}), "eth0 (" + address(0) + "; routes to " + address(0) + ")");
  EXPECT_EQ(env_on(1, {{"GLOO_SOCKET_IFNAME", "lo"}}), "lo (127.0.0.1; GLOO_SOCKET_IFNAME)");
  const auto wrong = env_on(1, {{"GLOO_SOCKET_IFNAME", "eth7"}});
  EXPECT_NE(wrong.find("GLOO_SOCKET_IFNAME=eth7 names no interface of this host"), std::string::npos) << wrong;
  EXPECT_NE(wrong.find("eth0 (" + address(1) + ")"), std::string::npos) << wrong;
}

// Node 1's cable is cut while every rank pauses after its first batch: node 0's ranks give up
// at their next collective within the collective timeout (5 s), naming what they waited for.
TEST_F(Hosts, ACutLinkEndsTheJobWithinTheTimeoutNamingTheUnreachableRanks) {
  make_nodes(2);
  testing::TempDir dir("lockstep_cut");
  auto program = trainer(dir, "cut", 2, 2, 8, 50, 5);
  program.insert(program.end(), {"--pause-ms", "1000"});
  std::vector<testing::CommandResult> results;
  std::thread job([&] { results = launch({2, 2}, program, {}, std::chrono::seconds(60)); });
  const auto paused = dir / "cut/paused.2";
  for (int i = 0; i < 3000 && !std::filesystem::exists(paused); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const bool training = std::filesystem::exists(paused);
  const auto cut_at = std::chrono::steady_clock::now();
  if (training) nodes({"link", name_, "1", "down"});
  job.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - cut_at).count();
  ASSERT_TRUE(training) << "rank 2 never paused: " << all_output(results);
  std::cout << "[ cut ] the job ended " << seconds << " s after the cut (pause 1 s, timeout 5 s)\n";
  EXPECT_LT(seconds, 20.0) << "1 s of pause + 5 s of timeout, with room for a loaded machine";
  EXPECT_NE(results[0].exit_code, 0) << all_output(results);
  EXPECT_FALSE(std::filesystem::exists(dir / "cut/done.0")) << "rank 0 must not finish without its peers";
  const std::string named = "Unreachable: ranks 2, 3 (" + address(1) + ") do not answer on the network from here";
  EXPECT_NE(results[0].err.find("rank 0/4: broadcast 'DDP bucket order' did not complete (timeout 5 s)"),
            std::string::npos) << all_output(results);
  EXPECT_NE(results[0].err.find(named), std::string::npos) << all_output(results);
  EXPECT_NE(results[0].err.find("still waiting in broadcast 'DDP bucket order' after 1.25 s; ranks 2, 3"),
            std::string::npos) << "the warning names them a quarter of the timeout in: " << all_output(results);
}

// A slow link (1 Mbit/s into each node) trains to the same bits as a fast one.
TEST_F(Hosts, ASlowLinkTrainsToTheSameBits) {
  make_nodes(2);
  testing::TempDir dir("lockstep_slow");
  auto started = std::chrono::steady_clock::now();
  const auto fast = launch({2, 2}, trainer(dir, "fast", 2, 2, 8));
  std::cout << "[ fast ] trained in " << std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count()
            << " s\n";
  for (const auto& r : fast) ASSERT_EQ(r.exit_code, 0) << all_output(fast);
  for (int node : {0, 1}) ASSERT_EQ(nodes({"slow", name_, std::to_string(node), "1000"}).exit_code, 0);
  started = std::chrono::steady_clock::now();
  const auto slow = launch({2, 2}, trainer(dir, "slow", 2, 2, 8));
  std::cout << "[ slow ] trained in " << std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count()
            << " s on the slow link\n";
  for (const auto& r : slow) ASSERT_EQ(r.exit_code, 0) << all_output(slow);
  const auto a = written_parameters(dir / "fast"), b = written_parameters(dir / "slow");
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 4u);
  EXPECT_EQ(max_diff(a[0], b[0]), 0.0);
  EXPECT_EQ(max_diff(b[0], b[3]), 0.0);
}

// Nodes that start different numbers of processes (2 + 1) are refused at once on every node,
// with the reason, not after the collective timeout (bench_ddp's is 300 s).
TEST_F(Hosts, UnevenNodesAreRefusedAtOnceWithTheReason) {
  make_nodes(2);
  const auto results = launch({2, 1}, {bin + "/bench_ddp", "--model", "small", "--steps", "1", "--warmup", "1"}, {},
                              std::chrono::seconds(60));
  const std::string why = "rank 1 was started for a job of 2 processes, but rank 0 at " + address(0) + ":";
  for (const auto& r : results) {
    EXPECT_NE(r.exit_code, 0) << all_output(results);
    EXPECT_NE(r.err.find(why), std::string::npos) << all_output(results);
    EXPECT_NE(r.err.find("leads a job of 4. Every node must start the same number of processes"), std::string::npos)
        << all_output(results);
  }
}

}  // namespace
}  // namespace hosts_test
}  // namespace lockstep
