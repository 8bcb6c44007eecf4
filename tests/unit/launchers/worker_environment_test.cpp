#include <lockstep/launchers/launch_error.h>
#include <lockstep/launchers/worker_environment.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <optional>
#include <ostream>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "../../support/paths.h"
#include "process_support.h"

namespace lockstep {
namespace launchers {
namespace {

using namespace lockstep::testing;

// Sets (or unsets, for nullopt) a variable of this process for one scope.
class ScopedVariable {
 public:
  ScopedVariable(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      ::setenv(name, value->c_str(), 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedVariable() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

const std::set<std::string> kTorchrunNames = {
    "LOCAL_RANK", "RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE",
    "WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE", kNcclAsyncErrorHandling};

struct Layout {
  int nproc;
  int nnodes;
  int node_rank;
};

// Names the test cases (gtest and ctest print parameters with it).
void PrintTo(const Layout& layout, std::ostream* out) {
  *out << "nproc" << layout.nproc << "_nnodes" << layout.nnodes << "_node" << layout.node_rank;
}

class launch_worker_environment : public ::testing::TestWithParam<Layout> {};

TEST_P(launch_worker_environment, RanksAndSizesPerWorker) {
  const Layout layout = GetParam();
  ScopedVariable omp("OMP_NUM_THREADS", std::nullopt);
  const auto options = LaunchOptions()
                           .nproc_per_node(layout.nproc)
                           .nnodes(layout.nnodes)
                           .node_rank(layout.node_rank)
                           .master_addr("10.1.2.3")
                           .master_port(29511)
                           .run_id("job")
                           .log_dir("/logs");
  std::set<std::string> global_ranks;
  for (int local = 0; local < layout.nproc; ++local) {
    const auto vars = worker_variables(options, local, 29511);
    const std::string global = std::to_string(layout.node_rank * layout.nproc + local);
    const std::string world = std::to_string(layout.nproc * layout.nnodes);
    SCOPED_TRACE("local_rank " + std::to_string(local));
    EXPECT_EQ(vars.at("LOCAL_RANK"), std::to_string(local));
    EXPECT_EQ(vars.at("RANK"), global);
    EXPECT_EQ(vars.at("ROLE_RANK"), global);
    EXPECT_EQ(vars.at("GROUP_RANK"), std::to_string(layout.node_rank));
    EXPECT_EQ(vars.at("WORLD_SIZE"), world);
    EXPECT_EQ(vars.at("ROLE_WORLD_SIZE"), world);
    EXPECT_EQ(vars.at("LOCAL_WORLD_SIZE"), std::to_string(layout.nproc));
    EXPECT_EQ(vars.at("GROUP_WORLD_SIZE"), std::to_string(layout.nnodes));
    EXPECT_EQ(vars.at("ROLE_NAME"), "default");
    EXPECT_EQ(vars.at("MASTER_ADDR"), "10.1.2.3");
    EXPECT_EQ(vars.at("MASTER_PORT"), "29511");
    EXPECT_EQ(vars.at("TORCHELASTIC_RESTART_COUNT"), "0");
    EXPECT_EQ(vars.at("TORCHELASTIC_MAX_RESTARTS"), "0");
    EXPECT_EQ(vars.at("TORCHELASTIC_RUN_ID"), "job");
    EXPECT_EQ(vars.at("TORCHELASTIC_USE_AGENT_STORE"), "False");
    EXPECT_EQ(vars.at("TORCHELASTIC_ERROR_FILE"),
              "/logs/attempt_0/" + std::to_string(local) + "/error.json");
    EXPECT_EQ(vars.count("OMP_NUM_THREADS"), layout.nproc > 1 ? 1u : 0u);
    std::set<std::string> expected = kTorchrunNames;
    if (layout.nproc > 1) expected.insert("OMP_NUM_THREADS");
    EXPECT_EQ(names(vars), expected);
    global_ranks.insert(vars.at("RANK"));
  }
  EXPECT_EQ(global_ranks.size(), static_cast<std::size_t>(layout.nproc));
}

INSTANTIATE_TEST_SUITE_P(launch, launch_worker_environment,
                         ::testing::Values(Layout{1, 1, 0}, Layout{2, 1, 0}, Layout{4, 1, 0},
                                           Layout{2, 2, 1}, Layout{4, 3, 2}));

TEST(launch_worker_environment_omp, OnlySetWhenTheParentLeftItUnset) {
  const auto options = LaunchOptions().nproc_per_node(2);
  {
    ScopedVariable omp("OMP_NUM_THREADS", std::string("7"));
    EXPECT_EQ(worker_variables(options, 0, 1234).at("OMP_NUM_THREADS"), "7");
    EXPECT_EQ(worker_variables(LaunchOptions(), 0, 1234).at("OMP_NUM_THREADS"), "7");
  }
  ScopedVariable omp("OMP_NUM_THREADS", std::nullopt);
  EXPECT_EQ(worker_variables(options, 1, 1234).at("OMP_NUM_THREADS"), "1");
  EXPECT_EQ(worker_variables(LaunchOptions(), 0, 1234).count("OMP_NUM_THREADS"), 0u);
}

TEST(launch_worker_environment_nccl, KeepsTheParentsAsyncErrorHandling) {
  {
    ScopedVariable nccl(kNcclAsyncErrorHandling, std::string("0"));
    EXPECT_EQ(worker_variables(LaunchOptions(), 0, 1234).at(kNcclAsyncErrorHandling), "0");
  }
  ScopedVariable nccl(kNcclAsyncErrorHandling, std::nullopt);
  EXPECT_EQ(worker_variables(LaunchOptions(), 0, 1234).at(kNcclAsyncErrorHandling), "1");
}

TEST(launch_worker_environment_restarts, RestartCountNamesTheAttempt) {
  const auto options = LaunchOptions().nproc_per_node(2).max_restarts(3).log_dir("/logs");
  const auto vars = worker_variables(options, 1, 1234, 2);
  EXPECT_EQ(vars.at("TORCHELASTIC_RESTART_COUNT"), "2");
  EXPECT_EQ(vars.at("TORCHELASTIC_MAX_RESTARTS"), "3");
  EXPECT_EQ(vars.at("TORCHELASTIC_ERROR_FILE"), "/logs/attempt_2/1/error.json");
}

TEST(launch_worker_environment_errors, RejectsRankPortOrRestartOutOfRange) {
  const auto options = LaunchOptions().nproc_per_node(2);
  EXPECT_THROW(worker_variables(options, 2, 1234), LaunchError);
  EXPECT_THROW(worker_variables(options, -1, 1234), LaunchError);
  EXPECT_THROW(worker_variables(options, 0, 0), LaunchError);
  EXPECT_THROW(worker_variables(options, 0, 65536), LaunchError);
  EXPECT_THROW(worker_variables(options, 0, 1234, 1), LaunchError) << "max_restarts is 0";
  const auto restarting = LaunchOptions(options).max_restarts(2);
  EXPECT_THROW(worker_variables(restarting, 0, 1234, -1), LaunchError);
  EXPECT_THROW(worker_variables(restarting, 0, 1234, 3), LaunchError);
}

TEST(launch_worker_environment_port, FreePortCanBeBound) {
  const int port = find_free_port();
  ASSERT_GT(port, 0);
  ASSERT_LE(port, 65535);
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  address.sin_port = htons(static_cast<uint16_t>(port));
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0) << port;
  ::close(fd);
  EXPECT_EQ(resolve_master_port(LaunchOptions().master_port(29533)), 29533);
  EXPECT_GT(resolve_master_port(LaunchOptions()), 0);
}

bool python_has_torch() {
  TempDir dir;
  const auto python = start({LOCKSTEP_TEST_PYTHON, "-c",
                             "import importlib.util, sys; "
                             "sys.exit(importlib.util.find_spec('torch') is None)"},
                            dir.file("stderr"));
  return python.pid > 0 && wait_exit(python.pid, std::chrono::seconds(30)) == 0;
}

// Runs the real torchrun and our launcher on the same env-recording program: every worker must
// see the same variable names, and the same values except for the run's identity.
TEST(launch_worker_environment_torchrun, SameVariablesAsRealTorchrun) {
  if (!exists(LOCKSTEP_TEST_PYTHON) || !python_has_torch()) {
    GTEST_SKIP() << LOCKSTEP_TEST_PYTHON << " has no torch: cannot compare with the real torchrun";
  }
  TempDir torchrun_dir, ours_dir;
  const int port = find_free_port();
  // --redirects/--tee 1: under Python 3.11, torch 1.13 parses its default "0" (and "3") to None
  // and crashes: Std.from_str iterates an IntFlag, which now yields single-bit members only.
  const auto torchrun = start({LOCKSTEP_TEST_PYTHON, "-m", "torch.distributed.run",
                               "--nproc_per_node", "2", "--master_port", std::to_string(port),
                               "--redirects", "1", "--tee", "1", "--log_dir", torchrun_dir.file("logs"),
                               "--no_python", program("launch_worker"), torchrun_dir.path()},
                              torchrun_dir.file("stderr"));
  ASSERT_GT(torchrun.pid, 0);
  ASSERT_EQ(wait_exit(torchrun.pid, std::chrono::seconds(60)), 0) << torchrun.stderr_text();
  const auto ours = start({program("launch_driver"), "2", "1000", std::to_string(port), "--",
                           program("launch_worker"), ours_dir.path()},
                          ours_dir.file("stderr"));
  ASSERT_EQ(wait_exit(ours.pid, std::chrono::seconds(15)), 0) << ours.stderr_text();

  const std::set<std::string> identity = {"TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE",
                                          "TORCHELASTIC_USE_AGENT_STORE"};
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE("local_rank " + std::to_string(rank));
    auto theirs = read_variables(torchrun_dir.file("env." + std::to_string(rank)));
    auto mine = read_variables(ours_dir.file("env." + std::to_string(rank)));
    ASSERT_FALSE(theirs.empty());
    // Lockstep's one addition: a one-machine job meets in a private file, not on a port.
    ASSERT_EQ(mine.count("LOCKSTEP_STORE_FILE"), 1u);
    mine.erase("LOCKSTEP_STORE_FILE");
    // torchrun 2.2+ tells workers which signals its agent handles (SIGTERM,SIGINT,SIGHUP,SIGQUIT);
    // Lockstep's launcher forwards SIGINT, SIGTERM and SIGHUP and does not claim SIGQUIT.
    theirs.erase("TORCHELASTIC_SIGNALS_TO_HANDLE");
    const auto ours_names = names(mine), their_names = names(theirs);
    std::string only_ours, only_theirs;
    for (const auto& n : ours_names) if (!their_names.count(n)) only_ours += n + " ";
    for (const auto& n : their_names) if (!ours_names.count(n)) only_theirs += n + " ";
    EXPECT_EQ(only_ours + "| " + only_theirs, "| ") << "names only we set | only torchrun sets";
    for (const auto& [name, value] : theirs) {
      if (identity.count(name) > 0 || mine.count(name) == 0) continue;
      EXPECT_EQ(mine.at(name), value) << name;
    }
  }
}

}  // namespace
}  // namespace launchers
}  // namespace lockstep
