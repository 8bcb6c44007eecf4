// The `lockstep` command, run as a user runs it: env under recorded scheduler environments,
// launch, comm-bench, and bad input.
#include <gtest/gtest.h>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <ATen/Context.h>
#include <torch/torch.h>
#include <torch/version.h>


#include <lockstep/environments/cluster_environment.h>
#include <lockstep/launchers/worker_environment.h>
#include <lockstep/trainer/tuner.h>

#include "../support/command.h"
#include "../support/paths.h"
#include "../support/png_image.h"
#include "../support/temp_dir.h"
#include "../unit/launchers/process_support.h"

namespace lockstep {
namespace lockstep_test {
namespace {

using testing::run_command;

const std::string lockstep_bin = std::string(LOCKSTEP_BIN_DIR) + "/lockstep";

std::map<std::string, std::string> fixture(const std::string& name) {
  auto vars = environments::Environ::from_env_file(std::string(LOCKSTEP_SOURCE_DIR) +
                                                   "/tests/fixtures/environments/" + name)
                  .vars();
  vars["PATH"] = "/usr/bin:/bin";
  vars["LOCKSTEP_NO_BLAS_WARNING"] = "1";
  return vars;
}

std::map<std::string, std::string> plain_environment() {
  return {{"PATH", "/usr/bin:/bin"}, {"HOME", "/tmp"}};
}

nlohmann::json env_json(const std::map<std::string, std::string>& env, std::vector<std::string> extra = {}) {
  std::vector<std::string> argv{lockstep_bin, "env", "--json"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  auto result = run_command(argv, env);
  EXPECT_EQ(result.exit_code, 0) << result.err;
  return nlohmann::json::parse(result.out);
}

// --version names the program, Lockstep's version and the LibTorch it was built against, on the
// command and on every example.
TEST(LockstepVersion, EveryProgramSaysItsVersionAndItsLibTorch) {
  for (const std::string program : {"lockstep", "fashion_mnist", "gan", "custom_ddp", "readme_net"}) {
    auto result = run_command({std::string(LOCKSTEP_BIN_DIR) + "/" + program, "--version"}, plain_environment());
    EXPECT_EQ(result.exit_code, 0) << program << ": " << result.err;
    const std::string libtorch = std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR);
    EXPECT_EQ(result.out.rfind(program + " (Lockstep 0.1.0, built against LibTorch " + libtorch, 0), 0u) << result.out;
  }
}

// One "lockstep: error:" prefix, not two.
TEST(LockstepPlot, AWrongFolderIsOneClearError) {
  auto result = run_command({lockstep_bin, "plot", "/nonexistent/run"}, plain_environment());
  EXPECT_EQ(result.exit_code, 2) << result.err;
  EXPECT_EQ(result.err.rfind("lockstep: error: /nonexistent/run/metrics.csv does not exist", 0), 0u) << result.err;
  EXPECT_EQ(result.err.find("lockstep plot:"), std::string::npos) << result.err;
}

// Pixels of a PNG near colour (r, g, b) left of column `right` (the key sits outside the plot, on
// the right), so what is counted is what was drawn in the plot area.
int pixels_near(const std::string& png, int r, int g, int b, int right) {
  int width = 0, height = 0, channels = 0;
  unsigned char* pixels = stbi_load(png.c_str(), &width, &height, &channels, 3);
  if (pixels == nullptr) {
    ADD_FAILURE() << png << ": " << stbi_failure_reason();
    return 0;
  }
  int count = 0;
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < std::min(width, right); ++x) {
      const unsigned char* p = pixels + 3 * (y * width + x);
      count += std::abs(p[0] - r) + std::abs(p[1] - g) + std::abs(p[2] - b) < 60;
    }
  }
  stbi_image_free(pixels);
  return count;
}

// gnuplot's first two line colours (5.4 defaults): a series' points, then its smoothed line.
constexpr int kPoints[3] = {0x94, 0x00, 0xd3}, kSmoothed[3] = {0x00, 0x9e, 0x73};
constexpr int kPlotArea = 600;  // of the 900 columns; the key is right of it

// A run of one epoch has one validation point: drawn as a visible marker, with no gnuplot warning
// about an empty range (an explicit window around it).
TEST(LockstepPlot, ARunOfOneEpochDrawsItsPointWithoutWarnings) {
  testing::TempDir dir;
  std::ofstream(dir.file("metrics.csv")) << "step,epoch,val_acc,val_loss\n2,0,0.8,0.5\n";
  auto result = run_command({lockstep_bin, "plot", dir.path()}, plain_environment());
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(result.err, "");
  for (const std::string png : {"acc.png", "loss.png"}) {
    EXPECT_GE(pixels_near(dir.file(png), kPoints[0], kPoints[1], kPoints[2], kPlotArea), 40) << png << ": no visible marker";
    EXPECT_EQ(pixels_near(dir.file(png), kSmoothed[0], kSmoothed[1], kSmoothed[2], kPlotArea), 0) << png;
  }
}

// The LR finder's CSV (--lr-find writes RUN_DIR/lr_find.csv) is drawn as loss against a
// logarithmic learning rate, the suggestion a red dot; a CSV of something else is refused.
TEST(LockstepPlot, AnLRFindersCSVIsDrawnWithItsSuggestion) {
  testing::TempDir dir;
  LRFinder finder;
  for (int i = 0; i < 60; ++i) {
    finder.lrs.push_back(1e-6 * std::pow(10.0, i / 10.0));
    finder.losses.push_back(2.0 - 1.5 / (1 + std::exp(-(i - 35) / 3.0)) + (i > 50 ? (i - 50) * 0.3 : 0.0));
  }
  finder.write_csv(dir.file("lr_find.csv"));
  auto result = run_command({lockstep_bin, "plot", dir.path()}, plain_environment());
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("lr_find.png"), std::string::npos) << result.out;
  EXPECT_GE(pixels_near(dir.file("lr_find.png"), kPoints[0], kPoints[1], kPoints[2], kPlotArea), 200) << "the curve";
  EXPECT_GE(pixels_near(dir.file("lr_find.png"), 0xff, 0x00, 0x00, kPlotArea), 40) << "the suggestion's dot";
  std::filesystem::remove(dir.file("lr_find.png"));
  result = run_command({lockstep_bin, "plot", dir.file("lr_find.csv")}, plain_environment());
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_TRUE(std::filesystem::exists(dir.file("lr_find.png")));
  std::ofstream(dir.file("other.csv")) << "a,b\n1,2\n";
  result = run_command({lockstep_bin, "plot", dir.file("other.csv")}, plain_environment());
  EXPECT_EQ(result.exit_code, 2) << result.err;
  EXPECT_NE(result.err.find("is not an LR finder's CSV"), std::string::npos) << result.err;
}

// The per-step training loss is jagged: a smoothed line is drawn through it.
TEST(LockstepPlot, APerStepLossGetsASmoothedLine) {
  testing::TempDir dir;
  std::ofstream csv(dir.file("metrics.csv"));
  csv << "step,epoch,train_loss\n";
  for (int step = 1; step <= 40; ++step) csv << step << ",0," << 1.0 / step + (step % 2) * 0.2 << "\n";
  csv.close();
  auto result = run_command({lockstep_bin, "plot", dir.path()}, plain_environment());
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_GE(pixels_near(dir.file("loss.png"), kSmoothed[0], kSmoothed[1], kSmoothed[2], kPlotArea), 200);
  EXPECT_GE(pixels_near(dir.file("loss.png"), kPoints[0], kPoints[1], kPoints[2], kPlotArea), 200);
}

// A resumed run links to the run it resumed (resumed_from): plot draws them as one.
TEST(LockstepPlot, AResumedRunIsDrawnWithTheRunItResumed) {
  testing::TempDir dir;
  std::filesystem::create_directories(dir.file("version_0"));
  std::filesystem::create_directories(dir.file("version_1"));
  std::ofstream first(dir.file("version_0/metrics.csv")), second(dir.file("version_1/metrics.csv"));
  first << "step,epoch,train_loss\n";
  second << "step,epoch,train_loss\n";
  for (int step = 1; step <= 30; ++step) first << step << ",0," << 1.0 / step << "\n";
  for (int step = 31; step <= 60; ++step) second << step << ",1," << 1.0 / step << "\n";
  first.close();
  second.close();
  std::ofstream(dir.file("version_1/resumed_from")) << dir.file("version_0") << "\n";
  auto result = run_command({lockstep_bin, "plot", dir.file("version_1")}, plain_environment());
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(result.err, "");
  EXPECT_NE(result.out.find("drew 2 runs as one: " + dir.file("version_0") + " " + dir.file("version_1")),
            std::string::npos) << result.out;
}

// --devices 2 on a plain machine: the job is 2 processes, this one is rank 0 of 1 until fit
// launches the other; both are labelled.
TEST(LockstepEnv, TheJobAndThisProcessAreLabelled) {
  auto result = run_command({lockstep_bin, "env", "--devices", "2"}, plain_environment());
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("job: 2 process(es) = 2 per node x 1 node(s); strategy ddp"), std::string::npos)
      << result.out;
  EXPECT_NE(result.out.find("this process: global rank 0 of 1, local rank 0, node 0 (the Trainer starts the other "
                            "1 process(es) in fit)"),
            std::string::npos) << result.out;
  EXPECT_EQ(env_json(plain_environment(), {"--devices", "2"})["job_world_size"], 2);
}

TEST(LockstepEnv, PlainMachineIsLocal) {
  auto j = env_json(plain_environment());
  EXPECT_EQ(j["environment"], "local");
  EXPECT_EQ(j["world_size"], 1);
  EXPECT_EQ(j["global_rank"], 0);
  EXPECT_EQ(j["creates_processes_externally"], false);
  EXPECT_EQ(j["accelerator"], "cpu");
  EXPECT_EQ(j["strategy"], "single_device");
  for (const char* key : {"environment", "world_size", "global_rank", "local_rank", "node_rank", "main_address",
                          "main_port", "creates_processes_externally", "accelerator", "devices", "strategy"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
}

TEST(LockstepEnv, RecordedSlurmJob) {
  // 8 tasks on 2 nodes: what the Trainer would run needs --num-nodes 2, and says so without it.
  auto result = run_command({lockstep_bin, "env"}, fixture("slurm_srun_rank5.env"));
  EXPECT_EQ(result.exit_code, 2) << result.out;
  EXPECT_NE(result.err.find("--devices auto took the 4 process(es) slurm started on this node."), std::string::npos)
      << result.err;
  EXPECT_NE(result.err.find("Use --num-nodes 2"), std::string::npos) << result.err;
  auto j = env_json(fixture("slurm_srun_rank5.env"), {"--num-nodes", "2"});
  EXPECT_EQ(j["devices"], 4);
  EXPECT_EQ(j["environment"], "slurm");
  EXPECT_EQ(j["global_rank"], 5);
  EXPECT_EQ(j["world_size"], 8);
  EXPECT_EQ(j["local_rank"], 1);
  EXPECT_EQ(j["node_rank"], 1);
  EXPECT_EQ(j["creates_processes_externally"], true);
  EXPECT_EQ(j["strategy"], "ddp");
}

TEST(LockstepEnv, RecordedTorchrunJob) {
  auto env = fixture("torchrun_single_node_rank1.env");
  auto j = env_json(env);
  EXPECT_EQ(j["environment"], "torchelastic");
  EXPECT_EQ(j["global_rank"], 1);
  EXPECT_EQ(j["world_size"], 2);
  EXPECT_EQ(j["main_port"], std::stoi(env.at("MASTER_PORT")));
}

TEST(LockstepEnv, RecordedOpenMpiJob) {
  auto j = env_json(fixture("openmpi_single_node_rank3.env"));
  EXPECT_EQ(j["environment"], "mpi");
  EXPECT_EQ(j["global_rank"], 3);
  EXPECT_EQ(j["local_rank"], 3);
  EXPECT_EQ(j["creates_processes_externally"], true);
}

TEST(LockstepEnv, DevicesThatContradictSlurmAreAnError) {
  auto result = run_command({lockstep_bin, "env", "--devices", "2", "--num-nodes", "2"}, fixture("slurm_srun_rank5.env"));
  EXPECT_EQ(result.exit_code, 2) << result.out;
  EXPECT_NE(result.err.find("SLURM_NTASKS_PER_NODE=4"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("Use --devices 4"), std::string::npos) << result.err;
  EXPECT_EQ(env_json(fixture("slurm_srun_rank5.env"), {"--devices", "4", "--num-nodes", "2"})["devices"], 4);
}

TEST(LockstepEnv, EnvironmentVariableSetsFlagAndFlagWins) {
  auto env = plain_environment();
  env["LOCKSTEP_TRAINER_DEVICES"] = "3";
  EXPECT_EQ(env_json(env)["devices"], 3);
  EXPECT_EQ(env_json(env, {"--devices", "2"})["devices"], 2);
}

TEST(LockstepEnv, WarnsLoudlyOnReferenceBlas) {
  const std::string reference = "/usr/lib/x86_64-linux-gnu/blas/libblas.so.3";
  if (!std::filesystem::exists(reference)) GTEST_SKIP() << "libblas3 (reference BLAS) is not installed";
  if (at::hasMKL()) GTEST_SKIP() << "this LibTorch carries MKL (PyPI's builds): it never uses libblas";
  auto env = plain_environment();
  env["LD_PRELOAD"] = reference;
  auto result = run_command({lockstep_bin, "env", "--json"}, env);
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.err.find("WARNING: LibTorch is using the reference BLAS"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("apt-get install libopenblas0-pthread"), std::string::npos) << result.err;
  EXPECT_NE(nlohmann::json::parse(result.out)["blas"].get<std::string>().find("/blas/"), std::string::npos);
  // With OpenBLAS (what scripts/setup installs) there is no warning.
  auto quiet = run_command({lockstep_bin, "env", "--json"}, plain_environment());
  EXPECT_EQ(quiet.err.find("WARNING"), std::string::npos) << quiet.err;
}

TEST(LockstepLaunch, TwoWorkersSeeOneJob) {
  auto result = run_command({lockstep_bin, "launch", "--nproc-per-node", "2", "--", lockstep_bin, "env", "--json"},
                            plain_environment());
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const auto lines = result.out_lines();
  ASSERT_EQ(lines.size(), 2u) << result.out;
  std::set<int> ranks;
  std::set<std::string> addresses;
  for (const auto& line : lines) {
    auto j = nlohmann::json::parse(line);
    ranks.insert(j["global_rank"].get<int>());
    addresses.insert(j["main_address"].get<std::string>() + ":" + std::to_string(j["main_port"].get<int>()));
    EXPECT_EQ(j["world_size"], 2) << line;
    EXPECT_EQ(j["environment"], "torchelastic") << line;
    // What the Trainer would run: the 2 processes the launcher started on this node, with ddp.
    EXPECT_EQ(j["devices"], 2) << line;
    EXPECT_EQ(j["strategy"], "ddp") << line;
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1}));
  EXPECT_EQ(addresses.size(), 1u) << result.out;
}

// Workers started by `lockstep launch` are siblings, not parent and child: DDP's shared memory
// must still reach rank 0's segment (through /proc/<pid>/fd), and train as the self-launched job.
TEST(LockstepLaunch, SiblingWorkersShareDDPGradientMemory) {
  const std::vector<std::string> flags{"--model", "small", "--steps", "2", "--warmup", "1"};
  std::vector<std::string> launched{lockstep_bin, "launch", "--nproc-per-node", "2", "--",
                                    std::string(LOCKSTEP_BIN_DIR) + "/bench_ddp"};
  launched.insert(launched.end(), flags.begin(), flags.end());
  std::vector<std::string> self{std::string(LOCKSTEP_BIN_DIR) + "/bench_ddp", "--nproc-per-node", "2"};
  self.insert(self.end(), flags.begin(), flags.end());
  std::vector<nlohmann::json> reports;
  for (const auto& argv : {launched, self}) {
    auto result = run_command(argv, plain_environment(), std::chrono::seconds(60));
    ASSERT_EQ(result.exit_code, 0) << result.err;
    reports.push_back(nlohmann::json::parse(result.out_lines().back()));
  }
  EXPECT_EQ(reports[0]["gradient_transport"], "shared memory") << reports[0].dump();
  EXPECT_EQ(reports[1]["gradient_transport"], "shared memory") << reports[1].dump();
  EXPECT_EQ(reports[0]["loss"], reports[1]["loss"]) << "the same job, launched two ways";
}

// Open MPI's mpirun (openmpi-bin, installed by scripts/setup) starts the ranks: Lockstep reads
// its variables and trains the same job as when it launches itself. Each mpirun keeps its session
// folder under `session_base`: two mpiruns starting at once in /tmp race to create
// /tmp/ompi.<host>.<uid>, and one fails ("mkdir ... File exists").
std::vector<std::string> mpirun(int ranks, const std::vector<std::string>& program, const std::string& session_base) {
  std::vector<std::string> argv{"/usr/bin/mpirun", "--allow-run-as-root", "--oversubscribe", "-np",
                                std::to_string(ranks), "--mca", "orte_tmpdir_base", session_base,
                                "-x", "MASTER_PORT=" + std::to_string(launchers::find_free_port()),
                                "-x", "OMP_NUM_THREADS=1"};
  argv.insert(argv.end(), program.begin(), program.end());
  return argv;
}

TEST(LockstepUnderMpirun, RanksSeeTheMpiJob) {
  testing::TempDir session("lockstep_mpirun");
  auto result = run_command(mpirun(2, {lockstep_bin, "env", "--json"}, session.path()), plain_environment(),
                            std::chrono::seconds(60));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  std::set<int> ranks, local_ranks;
  for (const auto& line : result.out_lines()) {
    if (line.front() != '{') continue;  // Open MPI's own notices, if any
    auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j["environment"], "mpi") << line;
    EXPECT_EQ(j["world_size"], 2) << line;
    EXPECT_EQ(j["creates_processes_externally"], true) << line;
    ranks.insert(j["global_rank"].get<int>());
    local_ranks.insert(j["local_rank"].get<int>());
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1})) << result.out;
  EXPECT_EQ(local_ranks, (std::set<int>{0, 1})) << result.out;
}

TEST(LockstepUnderMpirun, DDPTrainsAsWhenItLaunchesItself) {
  const std::string bench = std::string(LOCKSTEP_BIN_DIR) + "/bench_ddp";
  const std::vector<std::string> flags{"--model", "small", "--steps", "3", "--warmup", "1"};
  std::vector<std::string> program{bench};
  program.insert(program.end(), flags.begin(), flags.end());
  std::vector<std::string> self{bench, "--nproc-per-node", "2"};
  self.insert(self.end(), flags.begin(), flags.end());
  std::vector<nlohmann::json> reports;
  testing::TempDir session("lockstep_mpirun");
  for (const auto& argv : {mpirun(2, program, session.path()), self}) {
    auto result = run_command(argv, plain_environment(), std::chrono::seconds(60));
    ASSERT_EQ(result.exit_code, 0) << result.err;
    reports.push_back(nlohmann::json::parse(result.out_lines().back()));
  }
  EXPECT_EQ(reports[0]["world_size"], 2);
  EXPECT_EQ(reports[0]["gradient_transport"], "shared memory") << reports[0].dump();
  EXPECT_EQ(reports[0]["loss"], reports[1]["loss"]) << "mpirun's job and the self-launched one differ";
}

// --max-restarts 1 with the Trainer's --ckpt-path last: rank 1 crashes once after step 6 (epoch 1,
// Adam, shuffled data); every worker starts again, resumes from the last.ckpt of epoch 0, and the
// job ends bit for bit where the same job without the crash ends.
TEST(LockstepLaunch, ARestartedTrainerEndsAsTheJobWithoutTheCrash) {
  testing::TempDir dir("lockstep_restarts");
  const auto job = [&](const std::string& name, const std::vector<std::string>& extra) {
    const std::string out = dir.path() + "/" + name;
    std::filesystem::create_directories(out);
    std::vector<std::string> argv{lockstep_bin, "launch", "--nproc-per-node", "2", "--max-restarts", "1",
                                  "--grace-period", "2", "--", std::string(LOCKSTEP_BIN_DIR) + "/../tests/trainer_program",
                                  "--out", out, "--default-root-dir", out + "/runs", "--timeout", "60", "--strategy",
                                  "ddp", "--adam", "--max-epochs", "3", "--ckpt-path", "last"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    const auto result = run_command(argv, {{"PATH", "/usr/bin:/bin"}, {"OMP_NUM_THREADS", "1"},
                                           {"LOCKSTEP_NO_BLAS_WARNING", "1"}}, std::chrono::seconds(100));
    EXPECT_EQ(result.exit_code, 0) << name << ": " << result.err;
    std::vector<std::vector<torch::Tensor>> ranks(2);
    for (int r = 0; r < 2; ++r) {
      if (std::filesystem::exists(out + "/params." + std::to_string(r) + ".pt")) {
        torch::load(ranks[r], out + "/params." + std::to_string(r) + ".pt");
      }
    }
    return std::make_pair(result, ranks);
  };
  const auto [whole, uninterrupted] = job("whole", {});
  const auto [restarted, resumed] = job("restarted", {"--crash-at-step", "6", "--crash-on-rank", "1"});
  EXPECT_NE(restarted.err.find("rank 1 crashes after step 6 on purpose"), std::string::npos) << restarted.err;
  EXPECT_NE(restarted.err.find("(restart 1 of 1) after worker local_rank=1 failed with exit code 3"),
            std::string::npos) << restarted.err;
  EXPECT_NE(restarted.err.find("lockstep: resuming from"), std::string::npos) << restarted.err;
  EXPECT_NE(restarted.err.find("the job succeeded after 1 restart(s)"), std::string::npos) << restarted.err;
  EXPECT_EQ(whole.err.find("restarting all"), std::string::npos) << whole.err;
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(uninterrupted[r].size(), 4u) << "rank " << r << ": " << whole.err;
    ASSERT_EQ(resumed[r].size(), 4u) << "rank " << r << ": " << restarted.err;
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_TRUE(torch::equal(uninterrupted[r][i], resumed[r][i])) << "rank " << r << ", parameter " << i;
    }
  }
}

TEST(LockstepLaunch, KillingOneWorkerTakesTheJobDown) {
  testing::become_subreaper();  // so "gone" can be told from "zombie" for every worker
  testing::TempDir dir;
  auto launcher = testing::start({lockstep_bin, "launch", "--nproc-per-node", "3", "--grace-period", "2", "--",
                                  testing::program("launch_worker"), dir.path(), "sleep=60000"},
                                 dir.file("launcher.err"));
  ASSERT_GT(launcher.pid, 0);
  std::vector<std::string> pid_files;
  for (int r = 0; r < 3; ++r) pid_files.push_back(dir.file("pid." + std::to_string(r)));
  ASSERT_TRUE(testing::wait_for_files(pid_files, std::chrono::seconds(20))) << launcher.stderr_text();
  std::vector<pid_t> pids;
  for (const auto& f : pid_files) pids.push_back(testing::read_pid(f));
  ::kill(pids[1], SIGKILL);
  // The others sleep 60 s: only the launcher's supervision can end them within 10 s.
  const auto code = testing::wait_exit(launcher.pid, std::chrono::seconds(10));
  ASSERT_TRUE(code.has_value()) << "lockstep launch still ran 10 s after a worker died";
  EXPECT_NE(*code, 0);
  EXPECT_EQ(*code, 128 + SIGKILL) << "the exit code is the failing worker's";
  EXPECT_TRUE(testing::all_gone_within(pids, std::chrono::seconds(5))) << "a worker outlived the job";
  EXPECT_NE(launcher.stderr_text().find("local_rank=1"), std::string::npos) << launcher.stderr_text();
  testing::kill_all(pids);
}

TEST(LockstepCommBench, ResultsAreCheckedAndReported) {
  auto result = run_command({lockstep_bin, "comm-bench", "--nproc-per-node", "2", "--sizes", "64K,1M", "--iters",
                             "3", "--warmup", "1", "--json", "--timeout", "30"},
                            plain_environment(), std::chrono::seconds(90));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const auto lines = result.out_lines();
  ASSERT_EQ(lines.size(), 6u) << result.out;  // 3 ops x 2 sizes, printed by rank 0 only
  for (const auto& line : lines) {
    auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j["correct"], true) << line;
    EXPECT_EQ(j["world_size"], 2);
    EXPECT_GT(j["busbw_gbps"].get<double>(), 0.0) << line;
    EXPECT_GT(j["raw_busbw_gbps"].get<double>(), 0.0) << line;
    // busbw as nccl-tests defines it: allreduce moves 2(n-1)/n of the data per rank.
    const double factor = j["op"] == "allreduce" ? 1.0 : (j["op"] == "allgather" ? 0.5 : 1.0);
    EXPECT_NEAR(j["busbw_gbps"].get<double>(), j["algbw_gbps"].get<double>() * factor, 1e-9) << line;
  }
}

// Bad input: one clear message naming the fix, exit code 2, for every case.
struct BadInput {
  std::vector<std::string> args;
  std::map<std::string, std::string> env;
  std::string needle;
};

TEST(LockstepBadInput, ExitTwoWithTheFix) {
  const std::vector<BadInput> cases = {
      {{"env", "--devices", "0"}, {}, "--devices 2"},
      {{"env", "--devices", "x"}, {}, "number of processes"},
      {{"env", "--accelerator", "tpu"}, {}, "does not apply to LibTorch"},
      {{"env", "--accelerator", "cuda"}, {}, "--accelerator cpu"},
      {{"env", "--accelerator", "quantum"}, {}, "auto, cpu, cuda or gpu"},
      {{"env", "--num-nodes", "0"}, {}, "--num-nodes"},
      {{"env"}, {{"RANK", "1"}}, "WORLD_SIZE"},
      {{"env"}, {{"RANK", "abc"}, {"WORLD_SIZE", "2"}}, "RANK"},
      {{"env"}, {{"LOCKSTEP_TRAINER_DEVICES", "-3"}}, "at least 1"},
      {{"launch", "--nproc-per-node", "0", "--", "/bin/true"}, {}, "--nproc-per-node"},
      {{"launch", "--", "/no/such/program"}, {}, "/no/such/program"},
      {{"launch", "--nproc-per-node", "2"}, {}, "command"},
      {{"launch", "--max-restarts", "-1", "--", "true"}, {}, "--max-restarts"},
      {{"launch", "--nnodes", "2", "--master-port", "29500", "--max-restarts", "1", "--", "true"}, {}, "--nnodes 1"},
      {{"comm-bench", "--sizes", "lots"}, {}, "--sizes 1M,25M,100M"},
      {{"comm-bench", "--ops", "alltoall"}, {}, "allreduce, broadcast, allgather"},
      {{"no-such-command"}, {}, "lockstep --help"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    auto env = plain_environment();
    for (const auto& [k, v] : cases[i].env) env[k] = v;
    std::vector<std::string> argv{lockstep_bin};
    argv.insert(argv.end(), cases[i].args.begin(), cases[i].args.end());
    auto result = run_command(argv, env, std::chrono::seconds(30));
    EXPECT_EQ(result.exit_code, 2) << "case " << i << ": " << result.err;
    EXPECT_NE(result.err.find(cases[i].needle), std::string::npos)
        << "case " << i << " should mention '" << cases[i].needle << "', got: " << result.err;
    EXPECT_EQ(result.err.find("terminate called"), std::string::npos) << "case " << i << ": " << result.err;
  }
}

}  // namespace
}  // namespace lockstep_test
}  // namespace lockstep
