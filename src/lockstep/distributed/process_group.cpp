#include <lockstep/distributed/process_group.h>

#include <algorithm>
#include <cctype>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#ifdef USE_C10D_NCCL  // set by the Torch package of a LibTorch built with NCCL (2.x CUDA builds)
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <lockstep/core/error.h>
#include <lockstep/distributed/network_route.h>

#include "agent_store_round.h"
#include "liveness_watch.h"
#include "rank_zero_probe.h"
#include "store_text.h"
#include "wait_for.h"

namespace lockstep {
namespace distributed {
namespace {

using detail::bytes_of;
using detail::seconds;
using detail::text_of;

void validate(const ProcessGroupOptions& o) {
  if (o.world_size() < 1) {
    throw DistributedError("world_size=" + std::to_string(o.world_size()) +
                           " is not a process count: it must be at least 1.");
  }
  if (o.rank() < 0 || o.rank() >= o.world_size()) {
    throw DistributedError("rank=" + std::to_string(o.rank()) + " is outside the job of world_size=" +
                           std::to_string(o.world_size()) + ": ranks run from 0 to world_size-1.");
  }
  if (o.main_port() < 1 || o.main_port() > 65535) {
    throw DistributedError("main_port=" + std::to_string(o.main_port()) +
                           " is not a TCP port: use 1..65535 (MASTER_PORT).");
  }
  if (o.cuda_device() >= 0 && o.backend() != "nccl") {
    throw UsageError("cuda_device=" + std::to_string(o.cuda_device()) + " is for the nccl backend, which communicates "
                     "on that device; " + o.backend() + " takes tensors where they are: leave cuda_device at -1.");
  }
  const auto backends = available_backends();
  if (std::find(backends.begin(), backends.end(), o.backend()) == backends.end()) {
    std::string names;
    for (const auto& b : backends) names += (names.empty() ? "" : ", ") + b;
    throw DistributedError("process group backend '" + o.backend() + "' is not available: this build of Lockstep "
                           "can create " + names + ". Use --process-group-backend " + backends.front() + ".");
  }
}

// A peer that went away must be an error that names it, not a silent death: Gloo writes to its
// sockets without MSG_NOSIGNAL, and SIGPIPE's default action ends the process (a 4-rank timeout
// test died so in CI). Python ignores SIGPIPE at start-up, which is why PyTorch's
// users never meet this; Lockstep does the same unless the program chose a handler itself.
void ignore_broken_pipes() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current {};
    if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) std::signal(SIGPIPE, SIG_IGN);
  });
}

// The backend called `name` (one of available_backends()); `device` becomes where its collectives
// need their tensors. NCCL's is the CUDA device cuda_device (>= 0), made current, or the current one.
// Gloo binds to `interface`.
c10::intrusive_ptr<Backend> create_backend(const std::string& name, const c10::intrusive_ptr<c10d::Store>& store,
                                           int rank, int size, const GlooInterface& interface,
                                           std::chrono::milliseconds timeout, int cuda_device, c10::Device& device) {
  ignore_broken_pipes();
  device = c10::Device(c10::kCPU);
#ifdef USE_C10D_NCCL
  if (name == "nccl") {
    if (cuda_device >= 0) c10::cuda::set_device(static_cast<c10::DeviceIndex>(cuda_device));
    device = c10::Device(c10::kCUDA, c10::cuda::current_device());
    auto options = c10d::ProcessGroupNCCL::Options::create();
    options->timeout = timeout;
    return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
  }
#else
  (void)cuda_device;
#endif
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(interface.address));
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
}

// Builds the backend, then waits until every rank has built its own. Gloo's constructor is not a
// synchronisation point: a rank that finishes connecting first and drops its group at once closes
// pairs a peer is still handshaking on ("Connection closed by peer", pytorch/pytorch#61396; about
// 1 run in 100 of a 4-rank subgroup test here). `who` names the rank in errors.
// `gloo_address` receives the address Gloo binds to.
c10::intrusive_ptr<Backend> make_backend(const std::string& name, const c10::intrusive_ptr<c10d::Store>& store,
                                         int rank, int size, const std::string& address,
                                         std::chrono::milliseconds timeout, int cuda_device, c10::Device& device,
                                         const std::string& who, std::string* gloo_address = nullptr) {
  GlooInterface interface;
  if (name == "gloo") {
    try {
      interface = gloo_interface(address);
    } catch (const DistributedError& e) {
      throw DistributedError(who + ": " + e.what());
    }
  }
  const auto started = std::chrono::steady_clock::now();
  c10::intrusive_ptr<Backend> backend;
  try {
    backend = create_backend(name, store, rank, size, interface, timeout, cuda_device, device);
  } catch (const std::exception& e) {
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started);
    const std::string how = waited >= timeout ? "timed out after " + seconds(timeout) : "failed after " + seconds(waited);
    const std::string fix = name == "nccl" ? " NCCL needs a CUDA GPU for every rank of this machine; without one "
                                             "use --process-group-backend gloo."
                                           : " Every rank must start; check the other ranks' output. Gloo here uses " +
                                                 interface.describe() + "; if the hosts connect through another "
                                                 "interface, set GLOO_SOCKET_IFNAME to it.";
    throw DistributedError(who + ": creating the " + name + " process group " + how + " (" + message_of(e) + ")." + fix);
  }
  try {
    if (store->add("lockstep_connected", 1) == size) store->set("lockstep_all_connected", std::vector<uint8_t>{1});
    store->wait({"lockstep_all_connected"}, timeout);
  } catch (const std::exception& e) {
    std::string arrived = "not all";
    try {
      arrived = "only " + std::to_string(store->add("lockstep_connected", 0)) + " of";
    } catch (const std::exception&) {
      // the store itself is gone: say what is known
    }
    throw DistributedError(who + ": " + arrived + " " + std::to_string(size) + " ranks finished connecting within " +
                           seconds(timeout) + " (" + message_of(e) + "). Every rank must start; check the other ranks' output.");
  }
  if (gloo_address != nullptr) *gloo_address = interface.address;
  return backend;
}

// Every rank's Gloo address, in rank order (one allgather of 64 bytes each), so that a rank whose
// collective stalls can say which hosts stopped answering. Ranks bound to loopback are on one host.
std::vector<std::string> exchange_addresses(Backend& backend, const std::string& mine, int size,
                                            std::chrono::milliseconds timeout, const std::string& who) {
  if (is_loopback_address(mine) || size < 2) return std::vector<std::string>(size, mine);
  constexpr int64_t kBytes = 64;  // an IPv6 address has at most 45 characters
  std::vector<at::Tensor> input{at::zeros({kBytes}, at::kByte)};
  std::memcpy(input[0].data_ptr(), mine.data(), std::min<size_t>(mine.size(), kBytes - 1));
  std::vector<std::vector<at::Tensor>> output(1);
  for (int r = 0; r < size; ++r) output[0].push_back(at::zeros({kBytes}, at::kByte));
  try {
    backend.allgather(output, input)->wait(timeout);
  } catch (const std::exception& e) {
    throw DistributedError(who + ": exchanging the ranks' addresses did not complete (timeout " + seconds(timeout) +
                           "): " + message_of(e) + ". Check the other ranks' output.");
  }
  std::vector<std::string> addresses;
  for (const auto& t : output[0]) addresses.emplace_back(static_cast<const char*>(t.data_ptr()));
  return addresses;
}

// LOCKSTEP_DISTRIBUTED_DEBUG: off (or unset) or detail, as TORCH_DISTRIBUTED_DEBUG spells them.
bool detail_from_environment() {
  const char* value = std::getenv("LOCKSTEP_DISTRIBUTED_DEBUG");
  std::string mode = value ? value : "";
  std::transform(mode.begin(), mode.end(), mode.begin(), [](unsigned char c) { return std::tolower(c); });
  if (mode.empty() || mode == "off") return false;
  if (mode == "detail") return true;
  throw UsageError(std::string("LOCKSTEP_DISTRIBUTED_DEBUG=") + value +
                   " is not known: use detail (compare every collective across ranks) or off.");
}

// Waits until all ranks of the job rank 0 leads have joined its store. A rank started for a job
// of another size (nodes started with different --nproc-per-node) is refused and ends the wait of
// every rank with the reason, instead of leaving them to wait out the timeout. One blocking wait
// (a TCPStore wait that times out leaves its answer on the connection, so it is never sliced).
void join_world(c10d::Store& store, const ProcessGroupOptions& o, const std::string& endpoint) {
  const std::string who = "rank " + std::to_string(o.rank()) + "/" + std::to_string(o.world_size());
  const std::string fix = " Every node must start the same number of processes (lockstep launch --nproc-per-node, "
                          "torchrun --nproc-per-node, srun --ntasks-per-node) and give the same node count.";
  const auto started = std::chrono::steady_clock::now();
  try {
    if (o.rank() == 0) store.set("lockstep/join/world_size", bytes_of(std::to_string(o.world_size())));
    const std::string leader = text_of(store.get("lockstep/join/world_size"));
    if (leader != std::to_string(o.world_size())) {
      const std::string why = "rank " + std::to_string(o.rank()) + " was started for a job of " +
                              std::to_string(o.world_size()) + " processes, but rank 0 at " + endpoint +
                              " leads a job of " + leader + ".";
      store.set("lockstep/join/refused", bytes_of(why));
      store.set("lockstep/join/done", bytes_of("refused"));
      throw DistributedError(who + ": " + why + fix);
    }
    const int64_t joined = store.add("lockstep/join/joined", 1);
    if (joined > o.world_size()) {
      throw DistributedError(who + ": rank 0 at " + endpoint + " already has all " + std::to_string(o.world_size()) +
                             " ranks of its job: this port belongs to another job (rank 0 of this one then fails "
                             "with 'already in use'). Start every rank of this job with a free MASTER_PORT.");
    }
    if (joined == o.world_size()) store.set("lockstep/join/done", bytes_of("joined"));
    try {
      store.wait({"lockstep/join/done"}, o.timeout());
    } catch (const std::exception& e) {
      throw DistributedError(who + ": rendezvous at " + endpoint + " timed out after " + seconds(o.timeout()) +
                             " (only " + std::to_string(store.add("lockstep/join/joined", 0)) + " of " +
                             std::to_string(o.world_size()) + " ranks joined). Check that every rank was started "
                             "with the same MASTER_ADDR/MASTER_PORT and that rank 0 is running.");
    }
    if (text_of(store.get("lockstep/join/done")) == "refused") {
      throw DistributedError(who + ": " + text_of(store.get("lockstep/join/refused")) + fix);
    }
  } catch (const DistributedError&) {
    throw;
  } catch (const std::exception& e) {
    throw DistributedError(who + ": rendezvous at " + endpoint + " failed after " +
                           seconds(std::chrono::duration_cast<std::chrono::milliseconds>(
                               std::chrono::steady_clock::now() - started)) +
                           " (" + message_of(e) + "). Check that rank 0 is running.");
  }
}

// One machine: a file instead of a listening socket.
c10::intrusive_ptr<c10d::Store> open_file_store(const ProcessGroupOptions& options) {
  try {
    return c10::make_intrusive<c10d::FileStore>(options.store_file(), options.world_size());
  } catch (const std::exception& e) {
    throw DistributedError("rank " + std::to_string(options.rank()) + "/" + std::to_string(options.world_size()) +
                           ": cannot open the rendezvous file " + options.store_file() + " (" + message_of(e) +
                           "). It lives in the launcher's private folder; start the job with one launcher.");
  }
}

// Rank 0's store (hosted by rank 0, or torchrun's agent's), once every rank joined it. Under the
// agent's store, `round` becomes this round's key prefix there.
c10::intrusive_ptr<c10d::Store> connect_tcp_store(const ProcessGroupOptions& options, std::string& round) {
  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<std::uint16_t>(options.main_port());
  store_options.timeout = options.timeout();
  // Under torchrun's agent every rank is a client of the agent's store, which may serve the whole
  // job: nobody waits for workers, and nothing is written outside this round's prefix.
  // Otherwise join_world, not the store, waits for the ranks: it also refuses ranks of another size.
  store_options.isServer = options.rank() == 0 && !options.use_agent_store();
  store_options.waitWorkers = false;
  const std::string endpoint = options.main_address() + ":" + std::to_string(options.main_port());
  if (!store_options.isServer && !options.use_agent_store()) {
    detail::await_rank_zero(options.main_address(), options.main_port(), options.timeout(),
                            "rank " + std::to_string(options.rank()) + "/" + std::to_string(options.world_size()));
  }
  c10::intrusive_ptr<c10d::Store> store;
  const auto started = std::chrono::steady_clock::now();
  try {
    store = c10::make_intrusive<c10d::TCPStore>(options.main_address(), store_options);
  } catch (const std::exception& e) {
    std::string what = message_of(e);
    what = what.substr(0, what.find('\n'));
    while (!what.empty() && (what.back() == '.' || what.back() == ' ')) what.pop_back();
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started);
    // Say what happened: a timeout only when the timeout ran out.
    const std::string how = waited >= options.timeout() ? "timed out after " + seconds(options.timeout())
                                                        : "failed after " + seconds(waited);
    std::string check;
    // LibTorch 1.x says "Address already in use", 2.x "EADDRINUSE".
    if (what.find("Address already in use") != std::string::npos || what.find("EADDRINUSE") != std::string::npos) {
      check = "Port " + std::to_string(options.main_port()) + " is already in use on this machine (another job, or "
              "one still shutting down): set MASTER_PORT to a free port, or leave it unset when the program "
              "launches its own ranks (a free one is picked).";
    } else if (options.use_agent_store()) {
      check = "Check that torchrun's agent is still running and listens at " + endpoint +
              " (TORCHELASTIC_USE_AGENT_STORE=True: every rank joins the agent's store).";
    } else {
      check = "Check that every rank was started with the same MASTER_ADDR/MASTER_PORT, that rank 0 is running and "
              "that the port is free.";
    }
    throw DistributedError("rank " + std::to_string(options.rank()) + "/" + std::to_string(options.world_size()) +
                           ": rendezvous at " + endpoint + " " + how + " (" + what + "). " + check);
  }
  if (options.use_agent_store()) {
    round = detail::agree_on_round(store, options.rank(), options.world_size(), options.timeout(),
                                   "rank " + std::to_string(options.rank()) + "/" + std::to_string(options.world_size()),
                                   endpoint);
    store = c10::make_intrusive<c10d::PrefixStore>(round, store);
  } else {
    join_world(*store, options, endpoint);
  }
  return store;
}

// A second connection to the job's store for the liveness watch's threads: the first may be
// blocked for the whole timeout in a wait of the main thread.
c10::intrusive_ptr<c10d::Store> second_connection(const ProcessGroupOptions& options, const std::string& round) {
  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<std::uint16_t>(options.main_port());
  store_options.timeout = options.timeout();
  store_options.isServer = false;
  store_options.waitWorkers = false;
  c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::TCPStore>(options.main_address(), store_options);
  if (!options.use_agent_store()) return store;
  return c10::make_intrusive<c10d::PrefixStore>(round, store);
}

}  // namespace

std::vector<std::string> available_backends() {
  // Only what create_backend builds, never a name that quietly builds Gloo. Debian's CPU LibTorch
  // 1.13 has Gloo alone; a LibTorch built with NCCL (PyPI's 2.x CUDA wheels) adds it. Lockstep
  // builds no MPI process group.
#ifdef USE_C10D_NCCL
  return {"gloo", "nccl"};
#else
  return {"gloo"};
#endif
}

ProcessGroup::ProcessGroup(c10::intrusive_ptr<c10d::Store> store,
                           c10::intrusive_ptr<Backend> backend, int rank, int world_size,
                           std::vector<int> global_ranks, std::chrono::milliseconds timeout,
                           std::string backend_name, c10::Device device, std::string main_address,
                           bool is_subgroup)
    : store_(std::move(store)),
      backend_(std::move(backend)),
      rank_(rank),
      world_size_(world_size),
      global_ranks_(std::move(global_ranks)),
      timeout_(timeout),
      backend_name_(std::move(backend_name)),
      device_(device),
      main_address_(std::move(main_address)),
      is_subgroup_(is_subgroup) {}

std::shared_ptr<ProcessGroup> ProcessGroup::init(const ProcessGroupOptions& options) {
  validate(options);
  if (!options.store_file().empty()) {
    // Gloo on loopback; the file store is safe to share with the watch's threads.
    auto store = open_file_store(options);
    auto group = init_with_store(store, ProcessGroupOptions(options).main_address("127.0.0.1"));
    group->watch_liveness(store, options, "the job's store file");
    return group;
  }
  std::string round;
  auto group = init_with_store(connect_tcp_store(options, round), options);
  const std::string endpoint = options.main_address() + ":" + std::to_string(options.main_port());
  if (options.world_size() > 1 && options.liveness_timeout().count() > 0) {
    group->watch_liveness(second_connection(options, round), options,
                          (options.use_agent_store() ? "torchrun's store at " : "rank 0's store at ") + endpoint);
  }
  return group;
}

void ProcessGroup::watch_liveness(const c10::intrusive_ptr<c10d::Store>& store, const ProcessGroupOptions& options,
                                  const std::string& store_name) {
  if (world_size_ < 2 || options.liveness_timeout().count() <= 0) return;
  std::vector<std::string> hosts;
  if (std::any_of(host_addresses_.begin(), host_addresses_.end(),
                  [&](const std::string& a) { return a != host_addresses_.front(); })) {
    hosts = host_addresses_;
  }
  liveness_ = std::make_shared<detail::LivenessWatch>(store, rank_, world_size_, options.liveness_timeout(),
                                                      std::move(hosts), describe(), store_name);
}

std::shared_ptr<ProcessGroup> ProcessGroup::init_with_store(const c10::intrusive_ptr<c10d::Store>& store,
                                                            const ProcessGroupOptions& options) {
  validate(options);
  const bool checks_collectives = options.check_collectives() || detail_from_environment();
  store->setTimeout(options.timeout());
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>("lockstep/world", store);
  c10::Device device(c10::kCPU);
  const std::string who = "rank " + std::to_string(options.rank()) + "/" + std::to_string(options.world_size());
  std::string gloo_address;
  auto backend = make_backend(options.backend(), prefixed, options.rank(), options.world_size(), options.main_address(),
                              options.timeout(), options.cuda_device(), device, who, &gloo_address);
  std::vector<int> ranks(options.world_size());
  for (int r = 0; r < options.world_size(); ++r) ranks[r] = r;
  auto group = std::shared_ptr<ProcessGroup>(new ProcessGroup(prefixed, backend, options.rank(),
                                                              options.world_size(), std::move(ranks),
                                                              options.timeout(), options.backend(), device,
                                                              options.main_address(), false));
  group->checks_collectives_ = checks_collectives;
  group->main_port_ = options.main_port();
  if (!gloo_address.empty()) {
    group->host_addresses_ = exchange_addresses(*backend, gloo_address, options.world_size(), options.timeout(), who);
  }
  return group;
}

std::shared_ptr<ProcessGroup> ProcessGroup::new_subgroup(const std::vector<int>& ranks) {
  const int id = subgroups_created_++;
  for (int r : ranks) {
    if (r < 0 || r >= world_size_) {
      throw DistributedError(describe() + ": new_subgroup got rank " + std::to_string(r) +
                             ", outside 0.." + std::to_string(world_size_ - 1) + ".");
    }
  }
  const auto it = std::find(ranks.begin(), ranks.end(), rank_);
  if (it == ranks.end()) return nullptr;
  const int sub_rank = static_cast<int>(it - ranks.begin());
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>("subgroup/" + std::to_string(id), store_);
  std::vector<int> members;
  for (int r : ranks) members.push_back(global_ranks_[r]);
  auto group = std::shared_ptr<ProcessGroup>(new ProcessGroup(prefixed, {}, sub_rank,
                                                              static_cast<int>(ranks.size()),
                                                              std::move(members), timeout_, backend_name_,
                                                              device_, main_address_, true));
  group->checks_collectives_ = checks_collectives_;
  group->main_port_ = main_port_;
  for (int r : ranks) {
    if (!host_addresses_.empty()) group->host_addresses_.push_back(host_addresses_[r]);
  }
  c10::Device device(c10::kCPU);
  group->backend_ = make_backend(backend_name_, prefixed, sub_rank, group->world_size_, main_address_, timeout_,
                                 device_.is_cuda() ? device_.index() : -1, device, group->describe());
  return group;
}

std::string ProcessGroup::unreachable_members() const {
  if (host_addresses_.empty()) return "";
  const std::string& mine = host_addresses_[rank_];
  std::vector<std::string> others;  // each other host once
  for (const auto& a : host_addresses_) {
    if (a != mine && std::find(others.begin(), others.end(), a) == others.end()) others.push_back(a);
  }
  if (others.empty()) return "";
  const auto answers = hosts_answering(others, main_port_, std::chrono::seconds(1));
  std::string ranks, hosts;
  int count = 0;
  for (size_t h = 0; h < others.size(); ++h) {
    if (answers[h]) continue;
    hosts += (hosts.empty() ? "" : ", ") + others[h];
    for (int r = 0; r < world_size_; ++r) {
      if (host_addresses_[r] != others[h]) continue;
      ranks += (ranks.empty() ? "" : ", ") + std::to_string(global_ranks_[r]);
      ++count;
    }
  }
  if (count == 0) return "";
  return (count > 1 ? "ranks " : "rank ") + ranks + " (" + hosts + ") " + (count > 1 ? "do" : "does") +
         " not answer on the network from here: a cut link, a host gone, or a firewall dropping packets";
}

std::string ProcessGroup::describe() const {
  std::string text = "rank " + std::to_string(rank_) + "/" + std::to_string(world_size_);
  if (is_subgroup_) {
    text += " of subgroup [";
    for (size_t i = 0; i < global_ranks_.size(); ++i) {
      text += (i ? ", " : "") + std::to_string(global_ranks_[i]);
    }
    text += "]";
  }
  return text;
}

}  // namespace distributed
}  // namespace lockstep
