// ProcessGroup::init over real TCPStores. Under torchrun's default static rendezvous the agent
// already hosts the store on MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True): here a TCPStore
// server on a free port plays that agent, and the ranks run as threads.
#include <lockstep/distributed/process_group.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <exception>
#include <functional>
#include <iostream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
#include <torch/torch.h>

#include <lockstep/distributed/collectives.h>

#include "../../support/thread_ranks.h"

namespace lockstep {
namespace distributed {
namespace {

using namespace std::chrono_literals;

// What torchrun's agent starts before its workers: a TCPStore server, here on a port the kernel
// picks, so that no other test can hold it.
c10::intrusive_ptr<c10d::TCPStore> start_agent_store() {
  c10d::TCPStoreOptions options;
  options.port = 0;
  options.isServer = true;
  options.waitWorkers = false;
  options.timeout = 20s;
  return c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options);
}

// A port that nothing listens on (the kernel's pick, released at once).
int closed_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  ::close(fd);
  return ntohs(address.sin_port);
}

// Options of `rank` as torchrun gives them with TORCHELASTIC_USE_AGENT_STORE=True: every rank
// joins the agent's store.
ProcessGroupOptions under_torchrun(int rank, int world_size, int port) {
  return ProcessGroupOptions(rank, world_size).main_address("127.0.0.1").main_port(port).use_agent_store(true).timeout(20s);
}

// Runs `world_size` ranks as threads through ProcessGroup::init; rethrows the first failure.
void run_ranks(int world_size, const std::function<ProcessGroupOptions(int)>& options_of,
               const std::function<void(ProcessGroup&)>& body) {
  testing::run_threads(world_size, [&](int rank) { body(*ProcessGroup::init(options_of(rank))); });
}

// Every rank checks an all_reduce, then leaves `probe/<rank>` = `value` in the group's store.
void all_reduce_and_probe(ProcessGroup& group, const std::string& value) {
  const int n = group.world_size();
  auto total = all_reduce(group, torch::tensor({static_cast<float>(group.rank() + 1)}), ReduceOp::sum);
  EXPECT_EQ(total.item<float>(), n * (n + 1) / 2.0f) << "rank " << group.rank();
  group.store()->set("probe/" + std::to_string(group.rank()), std::vector<uint8_t>(value.begin(), value.end()));
  barrier(group, "probed");
}

std::string value_of(c10d::Store& store, const std::string& key) {
  const auto bytes = store.get(key);
  return std::string(bytes.begin(), bytes.end());
}

class AgentStore : public ::testing::TestWithParam<int> {};

TEST_P(AgentStore, EveryRankJoinsTheAgentsStoreUnderTheRoundsPrefix) {
  const int world_size = GetParam();
  auto agent = start_agent_store();
  run_ranks(
      world_size, [&](int rank) { return under_torchrun(rank, world_size, agent->getPort()); },
      [](ProcessGroup& group) { all_reduce_and_probe(group, "1"); });
  for (int rank = 0; rank < world_size; ++rank) {
    const std::string key = "lockstep/world/probe/" + std::to_string(rank);
    EXPECT_TRUE(agent->check({"lockstep/round_1/" + key})) << "rank " << rank;
    EXPECT_FALSE(agent->check({key})) << "rank " << rank;
  }
}

TEST_P(AgentStore, EachRoundMeetsUnderItsOwnKeys) {
  // PyTorch 2.x's agent keeps its store for the whole job, and a round that re-forms the job
  // after a node joined has the same TORCHELASTIC_RESTART_COUNT: each round must neither read
  // nor overwrite the keys of the rounds before, whose gloo addresses name sockets that are gone.
  // The job shrinks to 2 ranks and grows back.
  const int world_size = GetParam();
  auto agent = start_agent_store();
  const std::vector<int> sizes{world_size, 2, world_size};
  for (size_t round = 1; round <= sizes.size(); ++round) {
    const int size = sizes[round - 1];
    run_ranks(
        size, [&](int rank) { return under_torchrun(rank, size, agent->getPort()); },
        [&](ProcessGroup& group) { all_reduce_and_probe(group, std::to_string(round)); });
  }
  for (size_t round = 1; round <= sizes.size(); ++round) {
    for (int rank = 0; rank < sizes[round - 1]; ++rank) {
      const std::string key =
          "lockstep/round_" + std::to_string(round) + "/lockstep/world/probe/" + std::to_string(rank);
      EXPECT_EQ(value_of(*agent, key), std::to_string(round)) << key;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, AgentStore, ::testing::Values(2, 3),
                         [](const auto& info) { return "ranks" + std::to_string(info.param); });

TEST(AgentStore, RankZeroThatHostsFindsThePortTaken) {
  // The bug this option fixes: without it rank 0 tries to host a store on the agent's port.
  auto agent = start_agent_store();
  try {
    ProcessGroup::init(ProcessGroupOptions(0, 2).main_port(agent->getPort()).timeout(5s));
    ADD_FAILURE() << "rank 0 hosted a store on the agent's port";
  } catch (const DistributedError& e) {
    // What happened, at once: the port is taken, not a timeout that never ran out.
    const std::string message = e.what();
    EXPECT_NE(message.find("Port " + std::to_string(agent->getPort()) + " is already in use on this machine"),
              std::string::npos) << message;
    EXPECT_NE(message.find("failed after"), std::string::npos) << message;
    EXPECT_EQ(message.find("within"), std::string::npos) << message;
    EXPECT_EQ(message.find("timed out"), std::string::npos) << message;
  }
}

TEST(AgentStore, NoAgentIsAnErrorWithinTheTimeout) {
  const auto start = std::chrono::steady_clock::now();
  try {
    ProcessGroup::init(under_torchrun(0, 2, closed_port()).timeout(1s));
    ADD_FAILURE() << "rendezvous without an agent succeeded";
  } catch (const DistributedError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("rank 0/2: rendezvous at 127.0.0.1:"), std::string::npos) << message;
    EXPECT_NE(message.find("torchrun's agent"), std::string::npos) << message;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 15s);
}

// Gloo's constructor alone is not a synchronisation point: a rank that returned from it first and
// dropped its group closed pairs a slower peer was still handshaking on (pytorch/pytorch#61396).
// When init() or new_subgroup() returns on any rank, every member has connected.
TEST(Connect, ReturnsOnlyWhenEveryRankHasConnected) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  const int n = 4;
  testing::run_threads(n, [&](int rank) {
    auto group = ProcessGroup::init_with_store(store, ProcessGroupOptions(rank, n).timeout(20s));
    EXPECT_EQ(store->add("lockstep/world/lockstep_connected", 0), n) << "rank " << rank;
    auto evens = group->new_subgroup({0, 2});
    if (rank % 2 == 1) return;  // leaves at once, as Collectives.Subgroups' odd ranks do
    EXPECT_EQ(store->add("lockstep/world/subgroup/0/lockstep_connected", 0), 2) << "rank " << rank;
    EXPECT_FLOAT_EQ(all_reduce(*evens, torch::ones({1}), ReduceOp::sum).item<float>(), 2.0f);
  });
}

// A peer that closed its sockets must be an error naming it (DistributedError), not SIGPIPE's
// silent death of the writer: creating a group ignores SIGPIPE, as Python does, unless the
// program set its own handler. Each case runs in a fresh copy of this test (a death test).
int sigpipe_disposition_after_a_group(void (*before)(int)) {
  std::signal(SIGPIPE, before);
  testing::run_ranks(2, [](ProcessGroup&) {});
  struct sigaction after {};
  ::sigaction(SIGPIPE, nullptr, &after);
  return after.sa_handler == SIG_IGN ? 1 : after.sa_handler == SIG_DFL ? 2 : 3;
}

void own_sigpipe_handler(int) {}

TEST(Connect, ABrokenPipeIsAnErrorNotADeath) {
  ::testing::FLAGS_gtest_death_test_style = "threadsafe";
  EXPECT_EXIT(std::_Exit(sigpipe_disposition_after_a_group(SIG_DFL)), ::testing::ExitedWithCode(1), "")
      << "SIGPIPE should be ignored once a group exists";
  EXPECT_EXIT(std::_Exit(sigpipe_disposition_after_a_group(own_sigpipe_handler)), ::testing::ExitedWithCode(3), "")
      << "the program's own SIGPIPE handler should be kept";
}

// A rank started by hand on a port that another program holds (rank 0 then fails with "already in
// use") must not wait out the 30-minute rendezvous timeout: it says what it found within seconds.
TEST(Rendezvous, ARankFindingAnotherProgramOnThePortFailsWithinSeconds) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);  // listens, never answers
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(::listen(fd, 8), 0);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  const int port = ntohs(address.sin_port);
  const auto start = std::chrono::steady_clock::now();
  std::string message;
  try {
    ProcessGroup::init(ProcessGroupOptions(1, 2).main_port(port).timeout(120s));
    ADD_FAILURE() << "rank 1 joined a program that is not a store";
  } catch (const DistributedError& e) {
    message = e.what();
  }
  ::close(fd);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 30s) << message;
  EXPECT_NE(message.find("rank 1/2: rendezvous at 127.0.0.1:" + std::to_string(port) + " failed after"),
            std::string::npos) << message;
  EXPECT_NE(message.find("did not answer as rank 0 of a Lockstep job within 10 s"), std::string::npos) << message;
  EXPECT_NE(message.find("Port " + std::to_string(port) + " is taken by another program or job"), std::string::npos)
      << message;
}

// The port held by a running job of the same size: its store answers, so the stray rank is
// refused by the count of ranks that joined, at once.
TEST(Rendezvous, ARankOfAnotherJobIsRefusedAtOnce) {
  const int port = closed_port();
  std::vector<std::shared_ptr<ProcessGroup>> job(2);
  testing::run_threads(2, [&](int rank) {
    job[rank] = ProcessGroup::init(ProcessGroupOptions(rank, 2).main_port(port).timeout(30s));
  });
  const auto start = std::chrono::steady_clock::now();
  try {
    ProcessGroup::init(ProcessGroupOptions(1, 2).main_port(port).timeout(120s));
    ADD_FAILURE() << "a third rank joined a job of two";
  } catch (const DistributedError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("rank 1/2: rank 0 at 127.0.0.1:" + std::to_string(port) + " already has all 2 ranks of "
                           "its job: this port belongs to another job"), std::string::npos) << message;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);
}

// Ranks may start before rank 0 (nodes boot at different times): they wait for it to listen.
TEST(Rendezvous, RanksStartedBeforeRankZeroWaitForIt) {
  const int port = closed_port();
  testing::run_threads(2, [&](int rank) {
    if (rank == 0) std::this_thread::sleep_for(1500ms);
    auto group = ProcessGroup::init(ProcessGroupOptions(rank, 2).main_port(port).timeout(30s));
    EXPECT_EQ(all_reduce(*group, torch::ones({1}), ReduceOp::sum).item<float>(), 2.0f);
  });
}

TEST(Rendezvous, NothingListeningIsATimeoutThatSaysSo) {
  const int port = closed_port();
  try {
    ProcessGroup::init(ProcessGroupOptions(1, 2).main_port(port).timeout(1s));
    ADD_FAILURE() << "rendezvous without rank 0 succeeded";
  } catch (const DistributedError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("rank 1/2: rendezvous at 127.0.0.1:" + std::to_string(port) + " timed out after 1 s "
                           "(nothing accepted connections there)"), std::string::npos) << message;
  }
}

// --process-group-backend nccl builds LibTorch's ProcessGroupNCCL where LibTorch has one. Without
// a GPU its constructor refuses, and that refusal (named, with the fix) proves it was called; a
// LibTorch without NCCL (Debian's 1.13) refuses the name before anything is built.
TEST(Backends, NcclIsLibTorchsProcessGroupNcclWhereLibTorchHasIt) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  const auto options = ProcessGroupOptions(0, 1).backend("nccl").timeout(10s);
  std::string message;
  try {
    auto group = ProcessGroup::init_with_store(store, options);
#ifdef USE_C10D_NCCL
    ASSERT_TRUE(torch::cuda::is_available()) << "a NCCL process group without a GPU";
    EXPECT_NE(dynamic_cast<c10d::ProcessGroupNCCL*>(group->backend().get()), nullptr);
    EXPECT_EQ(group->backend_name(), "nccl");
    EXPECT_TRUE(group->device().is_cuda()) << group->device();
    return;
#else
    FAIL() << "this LibTorch has no NCCL, yet a nccl process group was made";
#endif
  } catch (const DistributedError& e) {
    message = e.what();
  }
#ifdef USE_C10D_NCCL
  ASSERT_FALSE(torch::cuda::is_available()) << message;
  std::cout << "no GPU here: ProcessGroupNCCL's constructor refused, as expected\n";
  EXPECT_NE(message.find("rank 0/1: creating the nccl process group failed after"), std::string::npos) << message;
  EXPECT_NE(message.find("NCCL needs a CUDA GPU for every rank of this machine; without one use "
                         "--process-group-backend gloo."), std::string::npos) << message;
  EXPECT_EQ(message.find("frame #"), std::string::npos) << "LibTorch's backtrace: " << message;
#else
  EXPECT_NE(message.find("process group backend 'nccl' is not available: this build of Lockstep can create gloo."),
            std::string::npos) << message;
#endif
}

// Gloo reduces tensors where they are (the group's device is the CPU); a CUDA device for it would
// be an option that does nothing, so it is refused.
TEST(Backends, GlooCommunicatesOnTheCpuAndTakesNoCudaDevice) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto group = ProcessGroup::init_with_store(store, ProcessGroupOptions(0, 1).timeout(10s));
  EXPECT_EQ(group->device(), c10::Device(c10::kCPU));
  try {
    ProcessGroup::init_with_store(c10::make_intrusive<c10d::HashStore>(),
                                  ProcessGroupOptions(0, 1).cuda_device(0).timeout(10s));
    FAIL() << "a gloo group took cuda_device=0";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("cuda_device=0 is for the nccl backend, which communicates on that device; "
                                         "gloo takes tensors where they are: leave cuda_device at -1."),
              std::string::npos) << e.what();
  }
}

// NCCL reduces CUDA tensors only; the collectives copy a CPU tensor to the group's GPU and back,
// so metrics, flags and pickled objects work under nccl as under gloo.
TEST(Backends, NcclCollectivesTakeCpuTensors) {
#ifndef USE_C10D_NCCL
  GTEST_SKIP() << "this LibTorch has no NCCL";
#else
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a CUDA GPU; none is visible here (scripts/gpu-check runs it)";
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto group = ProcessGroup::init_with_store(store, ProcessGroupOptions(0, 1).backend("nccl").cuda_device(0).timeout(30s));
  ASSERT_EQ(group->device(), c10::Device(c10::kCUDA, 0));
  auto sum = all_reduce(*group, torch::full({3}, 2.5), ReduceOp::sum);
  EXPECT_TRUE(sum.device().is_cpu());
  EXPECT_TRUE(sum.equal(torch::full({3}, 2.5)));
  const auto parts = all_gather(*group, torch::arange(4));
  ASSERT_EQ(parts.size(), 1u);
  EXPECT_TRUE(parts[0].device().is_cpu());
  EXPECT_TRUE(parts[0].equal(torch::arange(4)));
  EXPECT_EQ(broadcast(*group, c10::IValue(std::string("from rank 0")), 0).toStringRef(), "from rank 0");
  auto on_gpu = all_reduce(*group, torch::ones({2}, torch::kCUDA), ReduceOp::mean);
  EXPECT_TRUE(on_gpu.is_cuda());
  EXPECT_TRUE(on_gpu.cpu().equal(torch::ones({2})));
#endif
}

}  // namespace
}  // namespace distributed
}  // namespace lockstep
