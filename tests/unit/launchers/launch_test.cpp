#include <lockstep/launchers/launch.h>
#include <lockstep/launchers/launch_error.h>

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "process_support.h"

namespace lockstep {
namespace launchers {
namespace {

using namespace lockstep::testing;
using std::chrono::milliseconds;

// `launch_driver NPROC GRACE_MS 0 -- launch_worker DIR ARGS...`, i.e. `lockstep launch`.
Process launch_workers(const TempDir& dir, int nproc, int grace_ms,
                       const std::vector<std::string>& worker_args) {
  std::vector<std::string> argv = {program("launch_driver"), std::to_string(nproc),
                                   std::to_string(grace_ms), "0", "--", program("launch_worker"),
                                   dir.path()};
  argv.insert(argv.end(), worker_args.begin(), worker_args.end());
  // TMPDIR: the job's log folder goes inside `dir`, gone with it even when the launcher is killed.
  return start(argv, dir.file("launcher.stderr"), {{"TMPDIR", dir.path()}});
}

std::vector<std::string> pid_files(const TempDir& dir, int nproc) {
  std::vector<std::string> files;
  for (int rank = 0; rank < nproc; ++rank) files.push_back(dir.file("pid." + std::to_string(rank)));
  return files;
}

// The pids the workers recorded (one that was terminated before recording it has none).
std::vector<pid_t> worker_pids(const TempDir& dir, int nproc) {
  std::vector<pid_t> pids;
  for (const auto& file : pid_files(dir, nproc)) {
    if (exists(file)) pids.push_back(read_pid(file));
  }
  return pids;
}

// Folders the launcher made for error files under `dir` (its TMPDIR).
int log_folders(const TempDir& dir) {
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    if (entry.path().filename().string().rfind("lockstep_", 0) == 0) ++count;
  }
  return count;
}

class launch_and_supervise_test : public ::testing::Test {
 protected:
  void SetUp() override { become_subreaper(); }
};

class launch_and_supervise_ranks : public launch_and_supervise_test,
                                   public ::testing::WithParamInterface<int> {};

TEST_P(launch_and_supervise_ranks, EveryWorkerSeesItsRank) {
  const int nproc = GetParam();
  TempDir dir;
  const auto launcher = launch_workers(dir, nproc, 1000, {});
  ASSERT_EQ(wait_exit(launcher.pid, milliseconds(15000)), 0) << launcher.stderr_text();
  std::set<std::string> ranks, ports;
  for (int local = 0; local < nproc; ++local) {
    SCOPED_TRACE("local_rank " + std::to_string(local));
    const auto vars = read_variables(dir.file("env." + std::to_string(local)));
    EXPECT_EQ(vars.at("LOCAL_RANK"), std::to_string(local));
    EXPECT_EQ(vars.at("RANK"), std::to_string(local));
    EXPECT_EQ(vars.at("WORLD_SIZE"), std::to_string(nproc));
    EXPECT_EQ(vars.at("LOCAL_WORLD_SIZE"), std::to_string(nproc));
    EXPECT_EQ(vars.at("MASTER_ADDR"), "127.0.0.1");
    EXPECT_NE(vars.at("MASTER_PORT"), "0");
    EXPECT_EQ(vars.count("PATH"), 1u) << "the parent's environment is kept";
    ranks.insert(vars.at("RANK"));
    ports.insert(vars.at("MASTER_PORT"));
  }
  EXPECT_EQ(ranks.size(), static_cast<std::size_t>(nproc));
  EXPECT_EQ(ports.size(), 1u) << "every worker must meet on one port";
  EXPECT_TRUE(all_gone_within(worker_pids(dir, nproc), milliseconds(1000)));
  EXPECT_EQ(log_folders(dir), 0) << "the empty error-file folders are removed after the job";
}

INSTANTIATE_TEST_SUITE_P(launch, launch_and_supervise_ranks, ::testing::Values(1, 2, 4));

TEST_F(launch_and_supervise_test, ExitCodeIsTheFailingWorkers) {
  TempDir dir;
  const auto start_time = Clock::now();
  const auto launcher = launch_workers(dir, 3, 2000, {"exit=1:3", "sleep=30000", "grandchild=0"});
  const auto code = wait_exit(launcher.pid, milliseconds(10000));
  EXPECT_EQ(code, 3) << launcher.stderr_text();
  EXPECT_LT(elapsed_ms(start_time), 20000) << "the other workers sleep 30 s: they were not stopped";
  const std::string report = launcher.stderr_text();
  EXPECT_NE(report.find("worker local_rank=1 (pid "), std::string::npos) << report;
  EXPECT_NE(report.find("exited with code 3; terminating 2 other worker(s)"), std::string::npos)
      << report;
  auto pids = worker_pids(dir, 3);
  EXPECT_EQ(pids.size(), 3u);
  pids.push_back(read_pid(dir.file("grandchild.0")));
  EXPECT_TRUE(all_gone_within(pids, milliseconds(1000))) << "a worker's own child is gone too";
  kill_all(pids);
}

TEST_F(launch_and_supervise_test, PointsAtTheErrorFileTheFailedWorkerWrote) {
  TempDir dir;
  const auto launcher = start(
      {program("launch_driver"), "2", "500", "0", "--", "/bin/sh", "-c",
       "[ \"$LOCAL_RANK\" = 1 ] && { echo '{\"message\": \"boom\"}' > \"$TORCHELASTIC_ERROR_FILE\"; "
       "exit 1; }; exec sleep 10"},
      dir.file("launcher.stderr"), {{"TMPDIR", dir.path()}});
  EXPECT_EQ(wait_exit(launcher.pid, milliseconds(5000)), 1) << launcher.stderr_text();
  const std::string report = launcher.stderr_text();
  const auto at = report.find("worker local_rank=1 left an error report in " + dir.path() +
                              "/lockstep_");
  ASSERT_NE(at, std::string::npos) << report;
  const std::string path = report.substr(report.find(dir.path(), at), report.find('\n', at) -
                                                                          report.find(dir.path(), at));
  EXPECT_NE(path.find("/attempt_0/1/error.json"), std::string::npos) << path;
  EXPECT_NE(read_text(path).find("boom"), std::string::npos) << path;
}

TEST_F(launch_and_supervise_test, SigkilledWorkerBringsTheJobDownWithinTheGracePeriod) {
  TempDir dir;
  // Rank 2 ignores SIGTERM, so the job needs the SIGKILL after the grace period.
  const auto launcher = launch_workers(dir, 3, 800, {"sleep=30000", "ignore_term=2"});
  ASSERT_TRUE(wait_for_files(pid_files(dir, 3), milliseconds(10000))) << launcher.stderr_text();
  const auto pids = worker_pids(dir, 3);
  const auto killed_at = Clock::now();
  ::kill(pids[1], SIGKILL);
  const auto code = wait_exit(launcher.pid, milliseconds(10000));
  const long elapsed = elapsed_ms(killed_at);
  EXPECT_EQ(code, 128 + SIGKILL) << launcher.stderr_text();
  EXPECT_GE(elapsed, 800) << "rank 2 ignores SIGTERM: it must get the whole grace period";
  EXPECT_LT(elapsed, 20000) << "rank 2 sleeps 30 s: it was not killed";
  const std::string report = launcher.stderr_text();
  EXPECT_NE(report.find("local_rank=1"), std::string::npos) << report;
  EXPECT_NE(report.find("killed by signal 9"), std::string::npos) << report;
  EXPECT_TRUE(all_gone_within(pids, milliseconds(1000)));
  kill_all(pids);
}

TEST_F(launch_and_supervise_test, WorkersDieWithTheLauncher) {
  TempDir dir;
  const auto launcher = launch_workers(dir, 2, 1000, {"sleep=30000"});
  ASSERT_TRUE(wait_for_files(pid_files(dir, 2), milliseconds(10000))) << launcher.stderr_text();
  const auto pids = worker_pids(dir, 2);
  ::kill(launcher.pid, SIGKILL);
  EXPECT_EQ(wait_exit(launcher.pid, milliseconds(2000)), 128 + SIGKILL);
  EXPECT_TRUE(all_gone_within(pids, milliseconds(2000))) << "PR_SET_PDEATHSIG did not fire";
  kill_all(pids);
}

TEST_F(launch_and_supervise_test, SigtermToTheLauncherIsForwarded) {
  TempDir dir;
  const auto launcher = launch_workers(dir, 2, 3000, {"sleep=30000", "record_term"});
  ASSERT_TRUE(wait_for_files(pid_files(dir, 2), milliseconds(10000))) << launcher.stderr_text();
  const auto pids = worker_pids(dir, 2);
  ::kill(launcher.pid, SIGTERM);
  EXPECT_EQ(wait_exit(launcher.pid, milliseconds(10000)), 128 + SIGTERM) << launcher.stderr_text();
  EXPECT_TRUE(exists(dir.file("term.0")));
  EXPECT_TRUE(exists(dir.file("term.1")));
  EXPECT_TRUE(all_gone_within(pids, milliseconds(1000)));
  kill_all(pids);
}

TEST_F(launch_and_supervise_test, SigintToTheLauncherIsForwarded) {
  TempDir dir;
  const auto launcher = launch_workers(dir, 2, 500, {"sleep=30000"});
  ASSERT_TRUE(wait_for_files(pid_files(dir, 2), milliseconds(10000))) << launcher.stderr_text();
  const auto pids = worker_pids(dir, 2);
  ::kill(launcher.pid, SIGINT);
  EXPECT_EQ(wait_exit(launcher.pid, milliseconds(10000)), 128 + SIGINT) << launcher.stderr_text();
  EXPECT_TRUE(all_gone_within(pids, milliseconds(1000)));
  kill_all(pids);
}

// `launch_driver NPROC 500 0 MAX_RESTARTS -- /bin/sh -c SCRIPT sh DIR`: SCRIPT sees `dir` as $1.
Process launch_script(const TempDir& dir, int nproc, int max_restarts, const std::string& script) {
  return start({program("launch_driver"), std::to_string(nproc), "500", "0", std::to_string(max_restarts), "--",
                "/bin/sh", "-c", script, "sh", dir.path()},
               dir.file("launcher.stderr"), {{"TMPDIR", dir.path()}});
}

// Every worker start appends "LOCAL_RANK RESTART_COUNT MAX_RESTARTS MASTER_PORT STORE_FILE" to
// $1/runs before it does anything else.
const std::string kRecordRun =
    "echo \"$LOCAL_RANK $TORCHELASTIC_RESTART_COUNT $TORCHELASTIC_MAX_RESTARTS $MASTER_PORT "
    "$LOCKSTEP_STORE_FILE\" >> \"$1/runs\"; ";

struct Run {
  std::string local_rank, restart_count, max_restarts, master_port, store_file;
};

std::vector<Run> runs_of(const TempDir& dir, const std::string& local_rank) {
  std::vector<Run> runs;
  std::istringstream lines(read_text(dir.file("runs")));
  for (std::string line; std::getline(lines, line);) {
    std::istringstream fields(line);
    Run run;
    fields >> run.local_rank >> run.restart_count >> run.max_restarts >> run.master_port >> run.store_file;
    if (run.local_rank == local_rank) runs.push_back(run);
  }
  std::sort(runs.begin(), runs.end(),
            [](const Run& a, const Run& b) { return std::stoi(a.restart_count) < std::stoi(b.restart_count); });
  return runs;
}

// Local rank 1 fails in the first attempt only; local rank 0 never does.
const std::string kRankOneFailsFirst =
    kRecordRun + "[ \"$LOCAL_RANK\" = 1 ] && [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ] && exit 3; exit 0";

TEST_F(launch_and_supervise_test, RestartsAllWorkersWithANewRendezvous) {
  TempDir dir;
  const auto launcher = launch_script(dir, 2, 1, kRankOneFailsFirst);
  ASSERT_EQ(wait_exit(launcher.pid, milliseconds(15000)), 0) << launcher.stderr_text();
  const auto rank_one = runs_of(dir, "1");
  ASSERT_EQ(rank_one.size(), 2u) << read_text(dir.file("runs"));
  EXPECT_EQ(rank_one[0].restart_count, "0");
  EXPECT_EQ(rank_one[1].restart_count, "1");
  EXPECT_EQ(rank_one[1].max_restarts, "1");
  EXPECT_NE(rank_one[0].master_port, rank_one[1].master_port) << "master_port 0: a new port per attempt";
  EXPECT_NE(rank_one[0].store_file, rank_one[1].store_file) << "a new rendezvous file per attempt";
  // The second attempt is the whole job again: local rank 0 ran in it too, on the same rendezvous.
  const auto rank_zero = runs_of(dir, "0");
  ASSERT_FALSE(rank_zero.empty());
  EXPECT_EQ(rank_zero.back().restart_count, "1");
  EXPECT_EQ(rank_zero.back().master_port, rank_one[1].master_port);
  EXPECT_EQ(rank_zero.back().store_file, rank_one[1].store_file);
  const std::string report = launcher.stderr_text();
  EXPECT_NE(report.find("restarting all 2 worker(s) (restart 1 of 1) after worker local_rank=1 failed with "
                        "exit code 3"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("the job succeeded after 1 restart(s)"), std::string::npos) << report;
  EXPECT_FALSE(exists(rank_one[1].store_file)) << "the rendezvous folders are removed";
  EXPECT_EQ(log_folders(dir), 0) << "the empty error-file folders of both attempts are removed";
}

TEST_F(launch_and_supervise_test, NoRestartsByDefault) {
  TempDir dir;
  const auto launcher = launch_script(dir, 2, 0, kRankOneFailsFirst);
  EXPECT_EQ(wait_exit(launcher.pid, milliseconds(15000)), 3) << launcher.stderr_text();
  ASSERT_EQ(runs_of(dir, "1").size(), 1u) << read_text(dir.file("runs"));
  EXPECT_EQ(runs_of(dir, "1")[0].max_restarts, "0");
  EXPECT_EQ(launcher.stderr_text().find("restart"), std::string::npos) << launcher.stderr_text();
}

TEST_F(launch_and_supervise_test, NoRestartWhenEveryWorkerSucceeds) {
  TempDir dir;
  const auto launcher = launch_script(dir, 2, 2, kRecordRun + "exit 0");
  EXPECT_EQ(wait_exit(launcher.pid, milliseconds(15000)), 0) << launcher.stderr_text();
  EXPECT_EQ(runs_of(dir, "0").size(), 1u) << read_text(dir.file("runs"));
  EXPECT_EQ(runs_of(dir, "1").size(), 1u) << read_text(dir.file("runs"));
  EXPECT_EQ(launcher.stderr_text().find("restart"), std::string::npos) << launcher.stderr_text();
}

TEST_F(launch_and_supervise_test, GivesUpAfterMaxRestartsWithTheLastCode) {
  TempDir dir;
  // Local rank 1 always fails, leaving an error report in its attempt's folder.
  const auto launcher = launch_script(
      dir, 2, 2,
      kRecordRun + "[ \"$LOCAL_RANK\" = 1 ] && { echo '{}' > \"$TORCHELASTIC_ERROR_FILE\"; exit 3; }; exit 0");
  EXPECT_EQ(wait_exit(launcher.pid, milliseconds(20000)), 3) << launcher.stderr_text();
  const auto rank_one = runs_of(dir, "1");
  ASSERT_EQ(rank_one.size(), 3u) << "the first attempt and 2 restarts: " << read_text(dir.file("runs"));
  for (int attempt = 0; attempt < 3; ++attempt) {
    EXPECT_EQ(rank_one[attempt].restart_count, std::to_string(attempt));
  }
  const std::string report = launcher.stderr_text();
  EXPECT_NE(report.find("(restart 2 of 2)"), std::string::npos) << report;
  EXPECT_EQ(report.find("(restart 3 of"), std::string::npos) << report;
  EXPECT_NE(report.find("giving up after 2 restart(s) (--max-restarts 2); worker local_rank=1 failed with exit "
                        "code 3 every time"),
            std::string::npos)
      << report;
  for (int attempt = 0; attempt < 3; ++attempt) {
    const std::string error_file = "/attempt_" + std::to_string(attempt) + "/1/error.json\n";
    EXPECT_NE(report.find(error_file), std::string::npos) << "attempt " << attempt << ": " << report;
  }
}

TEST_F(launch_and_supervise_test, NoRestartWhenTheLauncherIsAskedToStop) {
  TempDir dir;
  const auto launcher =
      launch_script(dir, 2, 2, kRecordRun + "echo $$ > \"$1/pid.$LOCAL_RANK\"; exec sleep 30");
  ASSERT_TRUE(wait_for_files(pid_files(dir, 2), milliseconds(10000))) << launcher.stderr_text();
  const auto pids = worker_pids(dir, 2);
  ::kill(launcher.pid, SIGTERM);
  EXPECT_EQ(wait_exit(launcher.pid, milliseconds(10000)), 128 + SIGTERM) << launcher.stderr_text();
  EXPECT_EQ(runs_of(dir, "0").size() + runs_of(dir, "1").size(), 2u) << read_text(dir.file("runs"));
  const std::string report = launcher.stderr_text();
  EXPECT_EQ(report.find("restarting all"), std::string::npos) << report;
  EXPECT_NE(report.find("not restarting: this launcher received signal 15"), std::string::npos) << report;
  EXPECT_TRUE(all_gone_within(pids, milliseconds(1000)));
  kill_all(pids);
}

// Whether this test process has a child (a worker started by mistake).
bool has_children() {
  int status = 0;
  return ::waitpid(-1, &status, WNOHANG) >= 0;
}

std::string launch_error(const std::vector<std::string>& command,
                         const LaunchOptions& options = LaunchOptions().nproc_per_node(2)) {
  try {
    launch_and_supervise(options, command);
  } catch (const LaunchError& error) {
    return error.what();
  }
  return "";
}

TEST_F(launch_and_supervise_test, MissingProgramFailsBeforeStartingAnything) {
  ASSERT_FALSE(has_children());
  std::string message = launch_error({"/nonexistent/train", "--flag"});
  EXPECT_NE(message.find("cannot launch '/nonexistent/train'"), std::string::npos) << message;
  EXPECT_NE(message.find("No such file"), std::string::npos) << message;

  message = launch_error({"lockstep-no-such-program-3141"});
  EXPECT_NE(message.find("no such program in PATH="), std::string::npos) << message;

  TempDir dir;
  const std::string script = dir.file("train.sh");
  std::ofstream(script) << "#!/bin/sh\nexit 0\n";
  ::chmod(script.c_str(), 0644);
  message = launch_error({script});
  EXPECT_NE(message.find("it is not executable (mode 644)"), std::string::npos) << message;
  message = launch_error({dir.path()});
  EXPECT_NE(message.find("is a folder"), std::string::npos) << message;

  message = launch_error({});
  EXPECT_NE(message.find("no program to launch"), std::string::npos) << message;
  message = launch_error({"/bin/true"}, LaunchOptions().nproc_per_node(0));
  EXPECT_NE(message.find("nproc_per_node=0"), std::string::npos) << message;
  EXPECT_FALSE(has_children());
}

TEST_F(launch_and_supervise_test, FindsProgramsInPathAndReturnsTheirCode) {
  EXPECT_EQ(launch_and_supervise(LaunchOptions().nproc_per_node(2), {"true"}), 0);
  EXPECT_EQ(launch_and_supervise(LaunchOptions().nproc_per_node(2).grace_period(milliseconds(500)),
                                 {"sh", "-c", "[ \"$LOCAL_RANK\" = 1 ] && exit 5; exit 0"}),
            5);
}

}  // namespace
}  // namespace launchers
}  // namespace lockstep
