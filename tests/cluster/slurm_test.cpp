// A SLURM cluster inside this machine (tests/cluster/slurm: munged, slurmctld, two slurmd): srun
// starts the ranks and Lockstep takes them from SLURM's variables, on one node or two; and sbatch's
// warning before the time limit (--signal=USR1@N) makes the job checkpoint, requeue itself and
// finish from its checkpoint. Skipped, with the reason, where SLURM cannot run (not root, no
// slurm-wlm or munge).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <thread>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "../support/command.h"
#include "../support/paths.h"
#include "../support/written_parameters.h"

namespace lockstep {
namespace slurm_test {
namespace {

const std::string slurm_script = std::string(LOCKSTEP_SOURCE_DIR) + "/tests/cluster/slurm";
const std::string trainer_program = std::string(LOCKSTEP_BIN_DIR) + "/../tests/trainer_program";
const std::string lockstep_bin = std::string(LOCKSTEP_BIN_DIR) + "/lockstep";

std::map<std::string, std::string> environment() {
  return {{"PATH", "/usr/sbin:/usr/bin:/sbin:/bin"}, {"OMP_NUM_THREADS", "1"}, {"LOCKSTEP_NO_BLAS_WARNING", "1"}};
}

// One cluster for the suite, brought down after it (and by the script's watcher if this process
// dies first).
class Slurm : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const auto check = testing::run_command({slurm_script, "check"}, environment(), std::chrono::seconds(20));
    if (check.exit_code != 0) {
      skip_reason() = "SLURM cannot run here: " + check.out + check.err;
      return;
    }
    cluster() = "/tmp/lockstep_slurm_" + std::to_string(::getpid());
    const auto up = testing::run_command({slurm_script, "up", cluster(), std::to_string(::getpid())}, environment(),
                                         std::chrono::seconds(60));
    if (up.exit_code != 0) up_error() = "tests/cluster/slurm up failed:\n" + up.out + up.err;
  }
  static void TearDownTestSuite() {
    if (cluster().empty()) return;
    const auto down = testing::run_command({slurm_script, "down", cluster()}, environment(), std::chrono::seconds(60));
    EXPECT_EQ(down.exit_code, 0) << down.err;
  }
  static std::string& skip_reason() {
    static std::string reason;
    return reason;
  }
  static std::string& up_error() {
    static std::string error;
    return error;
  }
  static std::string& cluster() {
    static std::string dir;
    return dir;
  }

  void SetUp() override {
    if (!skip_reason().empty()) GTEST_SKIP() << skip_reason();
    ASSERT_TRUE(up_error().empty()) << up_error();
    dir = std::filesystem::path(cluster()) / ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::create_directories(dir);
  }

  // What SLURM's clients need: the cluster's slurm.conf. Jobs inherit it (and so does `down`'s
  // search for the cluster's processes).
  static std::map<std::string, std::string> slurm_environment() {
    auto env = environment();
    env["SLURM_CONF"] = cluster() + "/slurm.conf";
    return env;
  }
  static testing::CommandResult slurm(std::vector<std::string> argv, std::chrono::seconds timeout = std::chrono::seconds(90)) {
    argv.insert(argv.begin(), "/usr/bin/env");
    return testing::run_command(argv, slurm_environment(), timeout);
  }

  // trainer_program writing into DIR/NAME, its runs under DIR/NAME_runs.
  std::vector<std::string> trainer(const std::string& name, const std::vector<std::string>& flags) {
    std::filesystem::create_directories(dir / name);
    std::vector<std::string> argv{trainer_program, "--out", (dir / name).string(), "--default-root-dir",
                                  (dir / (name + "_runs")).string(), "--timeout", "60"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    return argv;
  }
  // `srun SRUN_FLAGS PROGRAM...`, with a time limit of its own.
  static testing::CommandResult srun(std::vector<std::string> srun_flags, const std::vector<std::string>& program) {
    srun_flags.insert(srun_flags.begin(), {"srun", "--time=2"});
    srun_flags.insert(srun_flags.end(), program.begin(), program.end());
    return slurm(srun_flags);
  }
  // One process on the whole batch, without SLURM.
  std::vector<torch::Tensor> alone(const std::vector<std::string>& flags) {
    const auto result = testing::run_command(trainer("alone", flags), environment(), std::chrono::seconds(90));
    EXPECT_EQ(result.exit_code, 0) << result.err;
    const auto params = params_of("alone");
    return params.empty() ? std::vector<torch::Tensor>{} : params[0];
  }

  // Each rank's parameters, as trainer_program wrote them into DIR/NAME.
  std::vector<std::vector<torch::Tensor>> params_of(const std::string& name) {
    return testing::written_parameters(dir / name);
  }
  static double max_diff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
    return testing::max_diff(a, b);
  }

  // What `lockstep env --json` says on each rank of an srun step, by global rank.
  static std::vector<nlohmann::json> env_under_srun(const std::vector<std::string>& srun_flags,
                                                    const std::vector<std::string>& env_flags = {}) {
    std::vector<std::string> program{lockstep_bin, "env", "--json"};
    program.insert(program.end(), env_flags.begin(), env_flags.end());
    const auto result = srun(srun_flags, program);
    EXPECT_EQ(result.exit_code, 0) << result.err;
    std::vector<nlohmann::json> ranks;
    for (const auto& line : result.out_lines()) ranks.push_back(nlohmann::json::parse(line));
    std::sort(ranks.begin(), ranks.end(), [](const auto& a, const auto& b) { return a["global_rank"] < b["global_rank"]; });
    return ranks;
  }

  std::filesystem::path dir;
};

// srun starts both ranks on one node; the program takes its rank from SLURM and starts no other
// process, and trains as one process does on the batch of both.
TEST_F(Slurm, SrunRanksOnOneNodeTrainLikeOneProcess) {
  const auto ranks = env_under_srun({"--nodes=1", "--ntasks-per-node=2"});
  ASSERT_EQ(ranks.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(ranks[r]["environment"], "slurm") << ranks[r];
    EXPECT_EQ(ranks[r]["creates_processes_externally"], true) << ranks[r];
    EXPECT_EQ(ranks[r]["global_rank"], r) << ranks[r];
    EXPECT_EQ(ranks[r]["local_rank"], r) << ranks[r];
    EXPECT_EQ(ranks[r]["node_rank"], 0) << ranks[r];
    EXPECT_EQ(ranks[r]["world_size"], 2) << ranks[r];
    EXPECT_EQ(ranks[r]["devices"], 2) << ranks[r];
    EXPECT_EQ(ranks[r]["num_nodes"], 1) << ranks[r];
  }
  EXPECT_EQ(ranks[0]["main_address"], ranks[1]["main_address"]);
  EXPECT_EQ(ranks[0]["main_port"], ranks[1]["main_port"]);

  const auto one = alone({"--devices", "1", "--batch-size", "16", "--max-epochs", "2"});
  const auto result = srun({"--nodes=1", "--ntasks-per-node=2"},
                           trainer("srun", {"--devices", "2", "--strategy", "ddp", "--batch-size", "8", "--max-epochs", "2"}));
  EXPECT_EQ(result.exit_code, 0) << result.err;
  const auto ddp = params_of("srun");
  ASSERT_EQ(ddp.size(), 2u) << "both ranks must write their parameters: " << result.err;
  EXPECT_EQ(max_diff(ddp[0], ddp[1]), 0.0) << "replicas diverged";
  EXPECT_LE(max_diff(ddp[0], one), 1e-6);
}

// One rank on each of two nodes: the node rank comes from SLURM_NODEID and the main address from
// the first host of SLURM_NODELIST.
TEST_F(Slurm, SrunRanksOnTwoNodesTrainLikeOneProcess) {
  const auto ranks = env_under_srun({"--nodes=2", "--ntasks-per-node=1"}, {"--num-nodes", "2"});
  ASSERT_EQ(ranks.size(), 2u);
  const auto nodes = slurm({"sinfo", "-h", "-N", "-o", "%N"}).out_lines();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(ranks[r]["environment"], "slurm") << ranks[r];
    EXPECT_EQ(ranks[r]["global_rank"], r) << ranks[r];
    EXPECT_EQ(ranks[r]["local_rank"], 0) << ranks[r];
    EXPECT_EQ(ranks[r]["node_rank"], r) << ranks[r];
    EXPECT_EQ(ranks[r]["world_size"], 2) << ranks[r];
    EXPECT_EQ(ranks[r]["num_nodes"], 2) << ranks[r];
  }
  EXPECT_EQ(ranks[0]["main_address"], ranks[1]["main_address"]);
  EXPECT_NE(std::find(nodes.begin(), nodes.end(), ranks[0]["main_address"].get<std::string>()), nodes.end())
      << ranks[0]["main_address"] << " is not a node of the cluster";

  const auto one = alone({"--devices", "1", "--batch-size", "16", "--max-epochs", "2"});
  const auto result = srun({"--nodes=2", "--ntasks-per-node=1"},
                           trainer("srun", {"--num-nodes", "2", "--devices", "1", "--strategy", "ddp", "--batch-size",
                                            "8", "--max-epochs", "2"}));
  EXPECT_EQ(result.exit_code, 0) << result.err;
  const auto ddp = params_of("srun");
  ASSERT_EQ(ddp.size(), 2u) << "both ranks must write their parameters: " << result.err;
  EXPECT_EQ(max_diff(ddp[0], ddp[1]), 0.0) << "replicas diverged";
  EXPECT_LE(max_diff(ddp[0], one), 1e-6);
}

// sbatch --time=1 --signal=USR1@20: slurmctld checks time limits every 30 s and sends the warning
// at the first check that is less than 20 + 30 s before the end, so 10 to 40 s into the job: after
// the ranks catch SIGUSR1 (a warning at the start would kill them), while the first attempt pauses
// 44 s after its first batch, and never in the second attempt (2 s). Every rank saves last.ckpt,
// rank 0 requeues the job (scontrol requeue), and the second attempt resumes from the checkpoint
// and ends bit for bit where the job without the warning ends (same ranks, same operations in the
// same order: max diff 0).
TEST_F(Slurm, WarningBeforeTheTimeLimitRequeuesAndResumes) {
  const std::vector<std::string> flags{"--devices", "2", "--strategy", "ddp", "--adam", "--max-epochs", "3",
                                       "--ckpt-path", "last"};
  const auto whole = srun({"--nodes=1", "--ntasks-per-node=2"}, trainer("whole", flags));
  EXPECT_EQ(whole.exit_code, 0) << whole.err;

  std::string command;
  for (const auto& arg : trainer("job", flags)) command += " '" + arg + "'";
  const auto script = dir / "job.sh";
  std::ofstream(script) << "#!/bin/bash\n"
                        << "#SBATCH --nodes=1 --ntasks-per-node=2 --time=1 --signal=USR1@20\n"
                        << "#SBATCH --output=" << (dir / "job.out").string() << " --open-mode=append\n"
                        << "echo \"attempt ${SLURM_RESTART_COUNT:-0}\" >> " << (dir / "attempts").string() << "\n"
                        << "pause=()\n"
                        << "[ \"${SLURM_RESTART_COUNT:-0}\" -gt 0 ] || pause=(--pause-ms 44000)\n"
                        << "srun" << command << " \"${pause[@]}\"\n";
  const auto submitted = slurm({"sbatch", "--parsable", script.string()});
  ASSERT_EQ(submitted.exit_code, 0) << submitted.err;
  const std::string job = submitted.out_lines().at(0);

  // Until the job ends: about 46 s for the first attempt, 6 s before the requeued one starts
  // (cred_expire=5), 2 s for the second.
  const std::regex ended("JobState=(COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE) ");
  std::string info;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(150);
  while (std::chrono::steady_clock::now() < deadline) {
    info = slurm({"scontrol", "show", "job", "-o", job}, std::chrono::seconds(20)).out;
    if (std::regex_search(info, ended)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  const std::string out = testing::slurp((dir / "job.out").string());
  ASSERT_NE(info.find("JobState=COMPLETED "), std::string::npos) << info << "\n" << out;
  EXPECT_NE(info.find("Restarts=1 "), std::string::npos) << info;
  EXPECT_EQ(testing::slurp((dir / "attempts").string()), "attempt 0\nattempt 1\n");
  EXPECT_NE(out.find("lockstep: Requeued SLURM job " + job + " (scontrol requeue)"), std::string::npos) << out;
  const auto checkpoint = dir / "job_runs" / "lockstep_logs" / "version_0" / "checkpoints" / "last.ckpt";
  EXPECT_TRUE(std::filesystem::exists(checkpoint));
  EXPECT_NE(out.find("lockstep: resuming from " + checkpoint.string()), std::string::npos) << out;

  const auto uninterrupted = params_of("whole");
  const auto resumed = params_of("job");
  ASSERT_EQ(uninterrupted.size(), 2u) << whole.err;
  ASSERT_EQ(resumed.size(), 2u) << out;
  EXPECT_EQ(max_diff(uninterrupted[0], resumed[0]), 0.0);
  EXPECT_EQ(max_diff(uninterrupted[1], resumed[1]), 0.0);
}

}  // namespace
}  // namespace slurm_test
}  // namespace lockstep
