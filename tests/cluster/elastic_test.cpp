// An elastic job under torchrun on three namespaced hosts (tests/cluster/nodes), one worker each
// (tests/programs/trainer_program), meeting at node 0's c10d rendezvous with --nnodes 2:3. The
// torchrun is LOCKSTEP_TEST_PYTHON's: Debian's torch 1.13 on the Debian line, PyPI's torch 2.x
// from the venv on the 2.x line (whose agent shares one store with the workers for the whole job).
// Node 0 hosts the rendezvous and is never the one lost. Node 2 vanishes mid-epoch (its cable
// pulled, its processes killed, its namespace deleted): the liveness watch ends the other two,
// their agents re-form the job at 2 ranks, which resume from the newest checkpoint. Then node 2
// comes back and the job grows to 3 again. Each stretch equals a fresh run at its size from the
// same checkpoint, bit for bit, under DDP and under FSDP with sharded checkpoints (3 ranks'
// pieces resharded to 2, and back).
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <lockstep/checkpoint/checkpoint_io.h>
#include <lockstep/checkpoint/sharded_checkpoint.h>
#include <lockstep/launchers/worker_environment.h>

#include "namespaced_hosts.h"
#include "../support/command.h"
#include "../support/paths.h"
#include "../support/temp_dir.h"
#include "../support/written_parameters.h"

namespace lockstep {
namespace elastic_test {
namespace {

using namespace lockstep::testing;
namespace fs = std::filesystem;

int64_t unix_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

const std::string trainer_program = std::string(LOCKSTEP_BIN_DIR) + "/../tests/trainer_program";

// The rows of a file of numbers (trainer_program's steps.<rank> and starts).
std::vector<std::vector<int64_t>> rows_of(const std::string& path) {
  std::vector<std::vector<int64_t>> rows;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::vector<int64_t> row;
    for (std::string word; words >> word;) row.push_back(word == "-" ? -1 : std::stoll(word));
    if (row.size() == 3) rows.push_back(row);
  }
  return rows;
}

// The first row of `path` whose column `world` (1 in steps.0, 2 in starts) is `size` and whose
// time (column `at`) is after `after`.
std::optional<std::vector<int64_t>> first_row(const std::string& path, size_t world, int64_t size, size_t at,
                                              int64_t after) {
  for (const auto& row : rows_of(path)) {
    if (row[world] == size && row[at] > after) return row;
  }
  return std::nullopt;
}

// Polls `ready` every 20 ms for at most `limit`; false when it never held.
bool wait_for(const std::function<bool()>& ready, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!ready()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

// What a membership line names, "world size OLD -> NEW; resumed PATH (step S); N step(s) lost":
// S and N, and how many such lines there are.
struct Membership {
  int lines = 0;
  int64_t step = -1, lost = -1;
};
Membership membership(const std::string& printed, int from, int to) {
  const std::regex line("membership changed: world size " + std::to_string(from) + " -> " + std::to_string(to) +
                        "; resumed [^ ]+ \\(step ([0-9]+)\\); ([0-9]+) step\\(s\\) lost");
  Membership found;
  for (std::sregex_iterator it(printed.begin(), printed.end(), line), end; it != end; ++it, ++found.lines) {
    found.step = std::stoll((*it)[1].str());
    found.lost = std::stoll((*it)[2].str());
  }
  return found;
}

// The model's weights in a checkpoint: a full one's state_dict, or a sharded one's put together.
std::map<std::string, torch::Tensor> weights_in(const std::string& path) {
  std::map<std::string, torch::Tensor> weights;
  if (fs::is_directory(path)) {
    const std::string prefix = "state_dict/";
    for (const auto& [key, tensor] : checkpoint::load_sharded(path).tensors) {
      if (key.rfind(prefix, 0) == 0) weights[key.substr(prefix.size())] = tensor;
    }
  } else {
    for (const auto& entry : checkpoint::CheckpointIO().load(path).at("state_dict").toGenericDict()) {
      weights[entry.key().toStringRef()] = entry.value().toTensor();
    }
  }
  return weights;
}

class ElasticHosts : public NamespacedHosts {
 protected:
  // One torchrun agent on `node`, its worker trainer_program with `program`.
  void start(int node) {
    std::vector<std::string> argv{LOCKSTEP_TEST_PYTHON, "-m", "torch.distributed.run", "--nnodes", "2:3",
                                  "--nproc_per_node", "1", "--rdzv_backend", "c10d", "--rdzv_endpoint",
                                  "node0:" + std::to_string(port_), "--rdzv_id", "elastic_test", "--max_restarts", "3",
                                  "--monitor_interval", "0.5", "--rdzv_conf",
                                  "join_timeout=60,last_call_timeout=1,close_timeout=5",
                                  // Debian's torchrun crashes at start without them.
                                  "--redirects", "1", "--tee", "1", "--log_dir", dir_ / ("logs" + std::to_string(node)),
                                  "--no_python", trainer_program};
    argv.insert(argv.end(), program_.begin(), program_.end());
    auto env = cluster_environment();
    env["HOME"] = dir_.path();
    // Each node's own name is loopback there (as on Debian): Gloo takes the cable.
    env["GLOO_SOCKET_IFNAME"] = "eth0";
    // PyTorch 2.x's agents would hang when node 2 rejoins with the store they share with the
    // workers (docs/launching.md, "Elastic jobs"); torch 1.13 reads nothing of it.
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1";
    if (agents_.size() <= static_cast<size_t>(node)) agents_.resize(node + 1);
    agents_[node] = start_command(on_node(node, argv), env);
    ASSERT_GT(agents_[node].pid, 0) << "torchrun did not start";
  }
  // Waits for node `node`'s agent to end; what it said goes into `output_`.
  int finish(int node, std::chrono::seconds limit) {
    const auto result = finish_command(agents_[node], limit);
    agents_[node].pid = -1;
    output_ += result.out + result.err;
    return result.exit_code;
  }
  // What every agent and its workers printed so far (stderr: Lockstep's lines).
  std::string printed() const {
    std::string text = output_;
    for (const auto& agent : agents_) {
      if (agent.pid > 0) text += slurp(agent.dir + "/err");
    }
    return text;
  }
  void TearDown() override {
    for (auto& agent : agents_) {
      if (agent.pid > 0) ::kill(-agent.pid, SIGKILL);
      finish_command(agent, std::chrono::seconds(10));
    }
    NamespacedHosts::TearDown();
  }

  // trainer_program on nodes 0 .. ranks-1, one rank each as in the job (the same transport, so
  // the same sums), from a copy of `from`, saving its checkpoint at the end; the weights in it.
  std::map<std::string, torch::Tensor> fresh_resume(const std::string& name, const std::string& from, int ranks,
                                                    std::vector<std::string> flags) {
    const fs::path run = dir_ / name;
    fs::create_directories(run / "out");
    fs::copy(from, run / "from.ckpt", fs::copy_options::recursive);
    std::vector<std::string> argv = {trainer_program, "--out", (run / "out").string(), "--default-root-dir",
                                     (run / "runs").string(), "--ckpt-path", (run / "from.ckpt").string(), "--save",
                                     (run / "end.ckpt").string()};
    argv.insert(argv.end(), flags.begin(), flags.end());
    const auto results = launch(std::vector<int>(ranks, 1), argv);
    for (const auto& result : results) EXPECT_EQ(result.exit_code, 0) << name << ":\n" << result.err;
    return fs::exists(run / "end.ckpt") ? weights_in(run / "end.ckpt") : std::map<std::string, torch::Tensor>{};
  }

  void lose_and_regain_a_host(const std::vector<std::string>& strategy);

  TempDir dir_{"elastic"};
  int port_ = launchers::find_free_port();
  std::vector<std::string> program_;
  std::vector<StartedCommand> agents_;
  std::string output_;
};

void ElasticHosts::lose_and_regain_a_host(const std::vector<std::string>& strategy) {
  make_nodes(3);
  const std::string out = dir_ / "out";
  fs::create_directories(out);
  // The run's own flags, the same in the fresh runs it is compared with.
  auto flags = strategy;
  flags.insert(flags.end(), {"--max-epochs", "24", "--checkpoint-every-n-steps", "5", "--timeout", "60",
                             "--liveness-timeout", "3"});
  program_ = {"--out", out, "--default-root-dir", dir_ / "runs", "--step-ms", "200", "--ckpt-path", "last",
              "--keep-resumed", "--save", out + "/end.ckpt"};
  program_.insert(program_.end(), flags.begin(), flags.end());
  for (int node = 0; node < 3; ++node) start(node);
  const std::string steps = out + "/steps.0", starts = out + "/starts";
  ASSERT_TRUE(wait_for([&] { return rows_of(steps).size() >= 4 && rows_of(steps)[3][1] == 3; }, std::chrono::seconds(90)))
      << "the job never trained 4 steps on 3 ranks:\n" << printed();

  const int64_t lost = unix_ms();
  ASSERT_EQ(nodes({"lose", name_, "2"}).exit_code, 0);
  finish(2, std::chrono::seconds(10));
  int64_t detected = 0;
  wait_for([&] { return printed().find("stopped answering") != std::string::npos && (detected = unix_ms()); },
           std::chrono::seconds(60));
  std::optional<std::vector<int64_t>> shrunk;
  ASSERT_TRUE(wait_for([&] { return (shrunk = first_row(steps, 1, 2, 2, lost)).has_value(); }, std::chrono::seconds(60)))
      << "the two nodes left did not resume within 60 s of the loss:\n" << printed();
  const auto shrunk_start = first_row(starts, 2, 2, 0, lost);

  const int64_t back = unix_ms();
  ASSERT_EQ(nodes({"back", name_, "2", "3"}).exit_code, 0);
  start(2);
  std::optional<std::vector<int64_t>> grown;
  ASSERT_TRUE(wait_for([&] { return (grown = first_row(steps, 1, 3, 2, back)).has_value(); }, std::chrono::seconds(60)))
      << "the job did not grow back to 3 ranks within 60 s of node 2's return:\n" << printed();
  const auto grown_start = first_row(starts, 2, 3, 0, back);
  for (int node = 0; node < 3; ++node) {
    EXPECT_EQ(finish(node, std::chrono::seconds(90)), 0) << "node " << node << ":\n" << output_;
  }

  const auto shrink = membership(output_, 3, 2), grow = membership(output_, 2, 3);
  ASSERT_EQ(shrink.lines, 1) << output_;
  ASSERT_EQ(grow.lines, 1) << output_;
  const int64_t from_loss = shrink.step, from_grow = grow.step;
  EXPECT_EQ((*shrunk)[0], from_loss + 1) << "the steps go on from the checkpoint resumed";
  EXPECT_EQ((*grown)[0], from_grow + 1);
  EXPECT_EQ(grow.lost, 0) << "a joining node stops the job at a step, which it saves (SIGTERM from the agents)";
  std::vector<std::string> versions;
  for (const auto& entry : fs::directory_iterator(dir_ / "runs/lockstep_logs")) versions.push_back(entry.path().filename());
  EXPECT_EQ(versions, std::vector<std::string>{"version_0"}) << "one run, one log folder";
  // The last step of the attempt at 3 ranks (rank 0 may finish one more with node 2's gradients).
  int64_t reached = 0;
  for (const auto& row : rows_of(steps)) {
    if (row[1] != 3) break;
    reached = row[0];
  }
  EXPECT_EQ(shrink.lost, reached - shrink.step) << "the steps trained after the checkpoint resumed";
  std::cout << "[ measured ] node 2 lost; the attempt at 3 ranks reached step " << reached << "; rank 0 said:\n";
  const std::regex said("lockstep: membership changed[^\n]*");
  for (std::sregex_iterator it(output_.begin(), output_.end(), said), end; it != end; ++it) {
    std::cout << "[ measured ]   " << it->str() << "\n";
  }
  std::cout << "[ measured ] after the loss: detected " << (detected - lost) / 1e3 << " s, rendezvous done "
            << (shrunk_start ? ((*shrunk_start)[0] - lost) / 1e3 : -1) << " s, first step at 2 ranks "
            << ((*shrunk)[2] - lost) / 1e3 << " s\n[ measured ] after node 2's return: rendezvous done "
            << (grown_start ? ((*grown_start)[0] - back) / 1e3 : -1) << " s, first step at 3 ranks "
            << ((*grown)[2] - back) / 1e3 << " s\n";

  // The stretch at 2 ranks: a fresh 2-rank run from the checkpoint resumed after the loss, up to
  // the step the job grew at, ends with the weights the grown job started from.
  auto to_grow = flags;
  to_grow.insert(to_grow.end(), {"--max-steps", std::to_string(from_grow)});
  const auto two = fresh_resume("fresh2", out + "/resumed." + std::to_string(from_loss) + ".ckpt", 2, to_grow);
  EXPECT_EQ(max_diff(two, weights_in(out + "/resumed." + std::to_string(from_grow) + ".ckpt")), 0.0);
  // The stretch at 3 ranks, to the end.
  const auto three = fresh_resume("fresh3", out + "/resumed." + std::to_string(from_grow) + ".ckpt", 3, flags);
  EXPECT_EQ(max_diff(three, weights_in(out + "/end.ckpt")), 0.0);
}

TEST_F(ElasticHosts, ALostHostShrinksTheDdpJobAndItsReturnGrowsItBackBitForBit) {
  lose_and_regain_a_host({"--strategy", "ddp"});
}

TEST_F(ElasticHosts, ALostHostShrinksTheFsdpJobReshardingItsCheckpointAndItsReturnGrowsItBack) {
  lose_and_regain_a_host({"--strategy", "fsdp", "--fsdp-state-dict-type", "sharded"});
}

}  // namespace
}  // namespace elastic_test
}  // namespace lockstep
