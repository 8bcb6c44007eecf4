#include <lockstep/distributed/transport/shared_memory_allreduce.h>

#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <vector>

#include <fcntl.h>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/torch.h>

#include <lockstep/distributed/collectives.h>

#include "hosts.h"

namespace lockstep {
namespace distributed {
namespace {

using detail::describe_refusals;
using detail::gather_strings;
using detail::host_key;
using detail::ranks_by_host;

using Clock = std::chrono::steady_clock;

constexpr int kMaxRanks = 256;
constexpr int64_t kPage = 4096;

int64_t round_up(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

// The segment's first pages: a cross-process barrier and who is attached.
struct Header {
  alignas(64) std::atomic<uint32_t> count;       // arrivals at the current barrier
  alignas(64) std::atomic<uint32_t> generation;  // the futex word: bumped when all arrived
  alignas(64) std::atomic<uint32_t> aborted_by;  // 0, or 1 + the slot (rank on the host) that failed
  uint64_t token;                                // random: proves a rank mapped the right memory
  int32_t world_size;                            // ranks on this host
  int32_t pids[kMaxRanks];                   // per slot
  std::atomic<uint64_t> arrived[kMaxRanks];  // per slot: the last barrier it reached
  std::atomic<uint32_t> left[kMaxRanks];     // per slot: 1 once it stopped reducing (process alive or not)
  int64_t job[kMaxRanks][3];                 // per slot: offset, numel, dtype of the reduction it is in
};

const int64_t kHeaderBytes = round_up(sizeof(Header), kPage);

std::atomic<bool> die_after_arriving_last_flag{false};

long futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  // Not FUTEX_PRIVATE_FLAG: the word is shared between processes.
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

// False once `pid` has exited, zombies included (kill(pid, 0) would still succeed for those).
bool process_alive(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (stat.empty()) return false;
  const auto close = stat.rfind(')');  // the command name may hold spaces and parentheses
  if (close == std::string::npos || close + 2 >= stat.size()) return true;
  return stat[close + 2] != 'Z' && stat[close + 2] != 'X';
}

std::string errno_text(const std::string& call) { return call + ": " + std::strerror(errno); }

char* map_shared(int fd, int64_t bytes, std::string* error) {
  void* p = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p != MAP_FAILED) return static_cast<char*>(p);
  *error = errno_text("mmap");
  return nullptr;
}

// A new memfd of `bytes`, mapped, with its header for `slots` ranks; `offer` gets the path the
// other ranks open it by and the token that proves it. nullptr and `error` if it cannot be made.
char* create_segment(int64_t bytes, int slots, int* fd, nlohmann::json* offer, std::string* error) {
  std::random_device random;
  const uint64_t token = (static_cast<uint64_t>(random()) << 32) ^ random() ^ static_cast<uint64_t>(getpid());
  *fd = static_cast<int>(syscall(SYS_memfd_create, "lockstep-ddp", 1u /* MFD_CLOEXEC */));
  if (*fd < 0) {
    *error = errno_text("memfd_create");
    return nullptr;
  }
  if (ftruncate(*fd, bytes) != 0) {
    *error = errno_text("ftruncate");
    return nullptr;
  }
  // Shared memory is sparse: without this, too little of it would show up later as SIGBUS.
  if (const int rc = posix_fallocate(*fd, 0, bytes); rc != 0) {
    *error = "reserving " + std::to_string(bytes >> 20) + " MiB of shared memory: " + std::strerror(rc);
    return nullptr;
  }
  char* base = map_shared(*fd, bytes, error);
  if (!base) return nullptr;
  auto* header = new (base) Header();
  header->token = token;
  header->world_size = slots;
  (*offer)["path"] = "/proc/" + std::to_string(getpid()) + "/fd/" + std::to_string(*fd);
  (*offer)["token"] = token;
  return base;
}

template <typename T>
void sum_part(std::vector<T*> slots, int64_t begin, int64_t end, T divisor) {
  constexpr int64_t kBlock = 2048;
  alignas(64) T block[kBlock];
  for (int64_t start = begin; start < end; start += kBlock) {
    const int64_t n = std::min(kBlock, end - start);
    const T* first = slots[0] + start;
    for (int64_t i = 0; i < n; ++i) block[i] = first[i];
    for (size_t r = 1; r < slots.size(); ++r) {
      const T* other = slots[r] + start;
      for (int64_t i = 0; i < n; ++i) block[i] += other[i];
    }
    if (divisor != T(1)) {
      for (int64_t i = 0; i < n; ++i) block[i] /= divisor;
    }
    for (T* slot : slots) std::memcpy(slot + start, block, static_cast<size_t>(n) * sizeof(T));
  }
}

}  // namespace

struct SharedMemoryAllreduce::Segment {
  char* base = nullptr;
  int64_t bytes = 0;
  int64_t slot_bytes = 0;

  Segment(char* base_, int64_t bytes_, int64_t slot_bytes_) : base(base_), bytes(bytes_), slot_bytes(slot_bytes_) {}
  ~Segment() { munmap(base, static_cast<size_t>(bytes)); }
  Header& header() const { return *reinterpret_cast<Header*>(base); }
  char* slot(int rank) const { return base + kHeaderBytes + slot_bytes * rank; }
};

std::shared_ptr<SharedMemoryAllreduce> SharedMemoryAllreduce::connect(ProcessGroup& group, int64_t bytes_per_rank,
                                                                      const std::string& refused, std::string* why_not,
                                                                      const std::string& host) {
  auto refuse = [&](const std::string& reason) -> std::shared_ptr<SharedMemoryAllreduce> {
    if (why_not) *why_not = reason;
    return nullptr;
  };
  const int world = group.world_size();
  if (world < 2) return refuse("a single rank has nothing to share");
  // The hosts, each with its ranks in rank order; this rank's host and place on it.
  const auto hosts =
      ranks_by_host(gather_strings(group, host.empty() ? host_key() : host, "DDP shared memory hosts"));
  const auto& members = *std::find_if(hosts.begin(), hosts.end(), [&](const std::vector<int>& ranks) {
    return std::find(ranks.begin(), ranks.end(), group.rank()) != ranks.end();
  });
  const int local_size = static_cast<int>(members.size());
  const int local_rank = static_cast<int>(std::find(members.begin(), members.end(), group.rank()) - members.begin());
  const bool leader = local_rank == 0;
  const int64_t slot_bytes = round_up(std::max<int64_t>(bytes_per_rank, 64), kPage);
  const int64_t total = kHeaderBytes + slot_bytes * local_size;

  std::string error = refused;
  if (error.empty()) {
    const bool even = std::all_of(hosts.begin(), hosts.end(), [&](const auto& h) { return h.size() == members.size(); });
    if (local_size < 2) error = "no other rank on its host";
    if (!even) error = "hosts with different numbers of ranks";
    if (local_size > kMaxRanks) error = "more than " + std::to_string(kMaxRanks) + " ranks on one host";
  }
  // The first rank of each host creates its segment; the others open it through /proc.
  int fd = -1;
  char* base = nullptr;
  nlohmann::json offer = {{"path", ""}, {"token", 0}};
  if (leader && error.empty()) base = create_segment(total, local_size, &fd, &offer, &error);
  const auto offers = gather_strings(group, leader ? offer.dump() : "", "DDP shared memory offers");
  offer = nlohmann::json::parse(offers[members.front()]);
  const std::string path = offer["path"];
  if (!leader && error.empty() && !path.empty()) {
    struct stat opened {};
    if ((fd = open(path.c_str(), O_RDWR | O_CLOEXEC)) < 0) {
      error = errno_text("open " + path);
    } else if (fstat(fd, &opened) != 0) {
      error = errno_text("fstat " + path);
    } else if (opened.st_size != total) {
      // Mapping more than the file holds would end in SIGBUS at the first touch.
      error = "its host's segment holds " + std::to_string(opened.st_size) + " bytes, this rank needs " +
              std::to_string(total) + " bytes (ranks of one host disagree on the buckets' size)";
    } else if ((base = map_shared(fd, total, &error)) &&
               reinterpret_cast<Header*>(base)->token != offer["token"].get<uint64_t>()) {
      error = "not its host's segment";
    }
  }
  // Everyone has opened it (or failed): the file descriptors are no longer needed.
  const auto errors = gather_strings(group, error, "DDP shared memory answers");
  if (fd >= 0) close(fd);
  const std::string reason = describe_refusals(errors);
  if (!reason.empty() || path.empty()) {
    if (base) munmap(base, static_cast<size_t>(total));
    return refuse(reason);
  }
  auto segment = std::make_shared<Segment>(base, total, slot_bytes);
  segment->header().pids[local_rank] = getpid();
  // Across hosts, rank i of every host sums part i of the buckets with its peers over the backend.
  std::shared_ptr<ProcessGroup> across;
  if (hosts.size() > 1) {
    for (int i = 0; i < local_size; ++i) {
      std::vector<int> peers;
      for (const auto& h : hosts) peers.push_back(h[i]);
      auto subgroup = group.new_subgroup(peers);
      if (i == local_rank) across = subgroup;
    }
  }
  distributed::barrier(group, "DDP shared memory attached");
  return std::shared_ptr<SharedMemoryAllreduce>(new SharedMemoryAllreduce(
      std::move(segment), members, local_rank, std::move(across), group.describe(), group.timeout()));
}

SharedMemoryAllreduce::SharedMemoryAllreduce(std::shared_ptr<Segment> segment, std::vector<int> members,
                                             int local_rank, std::shared_ptr<ProcessGroup> across, std::string who,
                                             std::chrono::milliseconds timeout)
    : segment_(std::move(segment)),
      members_(std::move(members)),
      local_rank_(local_rank),
      local_size_(static_cast<int>(members_.size())),
      across_(std::move(across)),
      who_(std::move(who)),
      timeout_(timeout) {
  thread_ = std::thread([this] { run(); });
}

SharedMemoryAllreduce::~SharedMemoryAllreduce() {
  leave();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void SharedMemoryAllreduce::leave() {
  segment_->header().left[local_rank_].store(1, std::memory_order_release);
}

int64_t SharedMemoryAllreduce::bytes_per_rank() const { return segment_->slot_bytes; }

at::Tensor SharedMemoryAllreduce::region(int64_t offset, int64_t numel, const at::TensorOptions& options) {
  const int64_t bytes = numel * static_cast<int64_t>(options.dtype().itemsize());
  if (offset % 64 != 0 || offset < 0 || offset + bytes > segment_->slot_bytes) {
    throw std::invalid_argument("SharedMemoryAllreduce::region: bytes [" + std::to_string(offset) + ", " +
                                std::to_string(offset + bytes) + ") are not a 64-byte aligned part of the " +
                                std::to_string(segment_->slot_bytes) + "-byte slot.");
  }
  auto keep = segment_;
  return torch::from_blob(segment_->slot(local_rank_) + offset, {numel}, [keep](void*) {}, options);
}

c10::intrusive_ptr<c10::ivalue::Future> SharedMemoryAllreduce::allreduce(int64_t offset, at::Tensor tensor,
                                                                         double divisor) {
  const auto dtype = tensor.scalar_type();
  if ((dtype != at::kFloat && dtype != at::kDouble) || !tensor.is_contiguous() || !tensor.device().is_cpu()) {
    throw std::invalid_argument("SharedMemoryAllreduce: only contiguous float32 and float64 CPU tensors; got " +
                                tensor.toString() + ".");
  }
  region(offset, tensor.numel(), tensor.options());  // checks the bounds
  auto future = c10::make_intrusive<c10::ivalue::Future>(c10::TensorType::get());
  {
    std::lock_guard<std::mutex> lock(mutex_);
    jobs_.push_back(Job{offset, std::move(tensor), divisor, future});
  }
  wake_.notify_one();
  return future;
}

void SharedMemoryAllreduce::run() {
  std::string broken;  // after a failure the ranks are out of step: every later call fails too
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    try {
      if (!broken.empty()) throw DistributedError(broken);
      reduce(job);
      job.future->markCompleted(c10::IValue(job.tensor));
    } catch (const std::exception& e) {
      if (broken.empty()) broken = e.what();
      job.future->setError(std::make_exception_ptr(DistributedError(e.what())));
    }
  }
}

void SharedMemoryAllreduce::reduce(const Job& job) {
  char* mine = segment_->slot(local_rank_) + job.offset;
  const bool in_place = job.tensor.data_ptr() == mine;
  const size_t bytes = static_cast<size_t>(job.tensor.numel()) * job.tensor.element_size();
  if (!in_place) std::memcpy(mine, job.tensor.data_ptr(), bytes);
  const int64_t described[3] = {job.offset, job.tensor.numel(), static_cast<int64_t>(job.tensor.scalar_type())};
  std::memcpy(segment_->header().job[local_rank_], described, sizeof(described));
  barrier("gradients written");
  check_same_job();
  // Rank r reduces part r; parts start on 64-byte boundaries so no two ranks share a cache line.
  const int64_t count = job.tensor.numel();
  const int64_t align = 64 / static_cast<int64_t>(job.tensor.element_size());
  const int64_t per = round_up((count + local_size_ - 1) / local_size_, align);
  const int64_t begin = std::min(count, per * local_rank_);
  const int64_t end = std::min(count, begin + per);
  // Across hosts: sum within the host, then part r over the same part of the other hosts
  // (Gloo, rank r of every host), and divide only then.
  const double divide_here = across_ ? 1.0 : job.divisor;
  if (job.tensor.scalar_type() == at::kFloat) {
    sum_part<float>(slots_of<float>(job.offset), begin, end, static_cast<float>(divide_here));
  } else {
    sum_part<double>(slots_of<double>(job.offset), begin, end, divide_here);
  }
  if (across_ && end > begin) {
    const int64_t element = static_cast<int64_t>(job.tensor.element_size());
    std::vector<at::Tensor> part{torch::from_blob(mine + begin * element, {end - begin}, job.tensor.options())};
    c10d::AllreduceOptions options;
    options.timeout = timeout_;
    try {
      across_->backend()->allreduce(part, options)->wait(timeout_);
    } catch (const std::exception& e) {
      fail_all(std::string("the sum across hosts (") + across_->describe() + ") failed: " + e.what());
    }
    part[0].div_(job.divisor);
    for (int r = 0; r < local_size_; ++r) {
      if (r != local_rank_) std::memcpy(segment_->slot(r) + job.offset + begin * element, part[0].data_ptr(),
                                        static_cast<size_t>((end - begin) * element));
    }
  }
  barrier("sums written");
  // No third barrier: a rank writes its slot again only after the next call's first barrier.
  if (!in_place) std::memcpy(job.tensor.data_ptr(), mine, bytes);
}

void SharedMemoryAllreduce::check_same_job() {
  // Stable until the next barrier, which no rank passes before all have checked.
  const auto describe = [](const int64_t* job) {
    return "offset " + std::to_string(job[0]) + ", " + std::to_string(job[1]) + " " +
           c10::toString(static_cast<at::ScalarType>(job[2])) + " values";
  };
  const int64_t* mine = segment_->header().job[local_rank_];
  for (int r = 0; r < local_size_; ++r) {
    const int64_t* theirs = segment_->header().job[r];
    if (std::equal(mine, mine + 3, theirs)) continue;
    fail_all("ranks reduce different buckets: rank " + std::to_string(members_[local_rank_]) + " has " +
             describe(mine) + ", rank " + std::to_string(members_[r]) + " has " + describe(theirs) +
             ". Every rank must build the same DistributedDataParallel and run the same synchronised backward "
             "passes.");
  }
}

void SharedMemoryAllreduce::fail_all(const std::string& what) {
  uint32_t none = 0;
  segment_->header().aborted_by.compare_exchange_strong(none, static_cast<uint32_t>(local_rank_ + 1));
  throw DistributedError(who_ + ": shared-memory allreduce of a DDP bucket: " + what);
}

void SharedMemoryAllreduce::barrier(const char* phase) {
  Header& h = segment_->header();
  const uint64_t epoch = ++epoch_;
  const std::string where = std::string(" (") + phase + ", barrier " + std::to_string(epoch) + ")";
  if (const uint32_t by = h.aborted_by.load(std::memory_order_acquire)) {
    fail_all("rank " + std::to_string(members_[by - 1]) + " failed earlier; see its output" + where);
  }
  if (h.left[local_rank_].load(std::memory_order_acquire)) fail_all("this rank has left the reduction" + where);
  h.arrived[local_rank_].store(epoch, std::memory_order_relaxed);
  const uint32_t generation = h.generation.load(std::memory_order_acquire);
  if (h.count.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<uint32_t>(local_size_)) {
    if (die_after_arriving_last_flag.load()) _exit(0);
    h.count.store(0, std::memory_order_relaxed);
    h.generation.store(generation + 1, std::memory_order_release);
    futex(&h.generation, FUTEX_WAKE, INT_MAX, nullptr);
    return;
  }
  const auto deadline = Clock::now() + timeout_;
  while (h.generation.load(std::memory_order_acquire) == generation) {
    // Sleep in slices, never spin: on a busy host spinning takes the CPU from backward.
    timespec slice{0, 20 * 1000 * 1000};
    const long rc = futex(&h.generation, FUTEX_WAIT, generation, &slice);
    if (rc == 0 || errno == EAGAIN || errno == EINTR) continue;
    if (const uint32_t by = h.aborted_by.load(std::memory_order_acquire)) {
      fail_all("rank " + std::to_string(members_[by - 1]) + " failed; see its output" + where);
    }
    // Every rank's liveness, arrived or not: the last to arrive may die before it releases the rest.
    std::string missing, exited, left;
    for (int r = 0; r < local_size_; ++r) {
      const auto add = [&](std::string& list) { list += (list.empty() ? "" : ", ") + std::to_string(members_[r]); };
      if (!process_alive(h.pids[r])) {
        add(exited);
      } else if (r != local_rank_ && h.left[r].load(std::memory_order_acquire)) {
        add(left);
      }
      if (h.arrived[r].load(std::memory_order_relaxed) < epoch) add(missing);
    }
    if (h.generation.load(std::memory_order_acquire) != generation) return;
    const std::string waiting = missing.empty() ? "" : "; waiting for rank(s) " + missing;
    if (!exited.empty()) fail_all("rank(s) " + exited + " exited" + waiting + where);
    if (!left.empty()) {
      fail_all("rank(s) " + left + " left the reduction (an error there, or its DistributedDataParallel was "
               "destroyed) while their process lives on" + waiting + where + ". See those ranks' output.");
    }
    if (stopping_.load()) fail_all("stopped while waiting for rank(s) " + missing + where);
    if (Clock::now() > deadline) {
      std::ostringstream seconds;
      seconds << static_cast<double>(timeout_.count()) / 1000.0;
      fail_all("timed out after " + seconds.str() + " s waiting for rank(s) " + missing + where +
               ". Every rank must run the same synchronised backward passes; check those ranks' output.");
    }
  }
}

template <typename T>
std::vector<T*> SharedMemoryAllreduce::slots_of(int64_t offset) const {
  std::vector<T*> slots;
  for (int r = 0; r < local_size_; ++r) slots.push_back(reinterpret_cast<T*>(segment_->slot(r) + offset));
  return slots;
}

namespace detail {
void die_after_arriving_last() { die_after_arriving_last_flag = true; }
}  // namespace detail

}  // namespace distributed
}  // namespace lockstep
