// The Trainer under Debian's real torchrun with its default static rendezvous: the agent hosts
// the store on MASTER_PORT and tells the workers TORCHELASTIC_USE_AGENT_STORE=True, so rank 0
// must join that store instead of hosting one (tests/programs/trainer_program, 2 workers).
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <lockstep/launchers/worker_environment.h>

#include "../../support/command.h"
#include "../../support/paths.h"
#include "../../support/temp_dir.h"

namespace lockstep {
namespace {

using lockstep::testing::slurp;
using lockstep::testing::TempDir;

// Runs `argv` in a process group of its own, output into `log`, and returns its exit code; past
// `timeout` the whole group (torchrun and its workers) is SIGKILLed, reaped, and -1 returned.
int run_group(const std::vector<std::string>& argv, const std::vector<std::string>& env,
              const std::string& log, std::chrono::seconds timeout) {
  std::vector<std::string> args_copy = argv, env_copy = env;
  std::vector<char*> args, envp;
  for (auto& s : args_copy) args.push_back(s.data());
  args.push_back(nullptr);
  for (auto& s : env_copy) envp.push_back(s.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attributes, 0);
  pid_t pid = -1;
  const int spawned = posix_spawn(&pid, args[0], &actions, &attributes, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  if (spawned != 0) return -1;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(-pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  // Workers that outlived a failed torchrun must not outlive the test.
  if (code != 0) ::kill(-pid, SIGKILL);
  return code;
}

TEST(TorchElasticEnvironmentUnderTorchrun, TrainerRunsWithTheDefaultStaticRendezvous) {
  // torchrun of the Python whose torch matches this build's LibTorch: a 2.x TCPStore client
  // cannot talk to 1.13's agent store (its validation ping goes unanswered).
  const std::string python = LOCKSTEP_TEST_PYTHON;
  if (std::system((python + " -c 'import torch.distributed.run' 2>/dev/null").c_str()) != 0) {
    GTEST_SKIP() << python << " has no torch.distributed.run (Debian: python3-torch)";
  }
  const std::string program = std::string(LOCKSTEP_BIN_DIR) + "/../tests/trainer_program";
  TempDir dir("torchrun");
  const std::string port = std::to_string(launchers::find_free_port());
  // Debian's torchrun crashes at start without --redirects/--tee 1 (torch 1.13 on Python 3.11).
  const std::vector<std::string> argv = {python, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", port,
                                         "--redirects", "1", "--tee", "1", "--log_dir", dir / "logs",
                                         "--no_python", program, "--out", dir.path(),
                                         "--default-root-dir", dir / "runs", "--devices", "2",
                                         "--strategy", "ddp", "--max-epochs", "1", "--timeout", "30"};
  const std::string log = dir / "torchrun.log";
  const int code = run_group(argv, {"PATH=/usr/bin:/bin", "HOME=" + dir.path(), "OMP_NUM_THREADS=1"}, log,
                             std::chrono::seconds(60));
  ASSERT_EQ(code, 0) << "torchrun on port " << port << " exited " << code << ":\n" << slurp(log);

  std::vector<std::vector<torch::Tensor>> ranks(2);
  for (int rank = 0; rank < 2; ++rank) {
    const std::string params = dir / ("params." + std::to_string(rank) + ".pt");
    ASSERT_TRUE(std::filesystem::exists(params)) << "rank " << rank << " did not finish:\n" << slurp(log);
    torch::load(ranks[rank], params);
  }
  ASSERT_EQ(ranks[0].size(), ranks[1].size());
  for (size_t i = 0; i < ranks[0].size(); ++i) {
    EXPECT_TRUE(torch::equal(ranks[0][i], ranks[1][i])) << "parameter " << i << " differs between the ranks";
  }
}

}  // namespace
}  // namespace lockstep
