#include <lockstep/distributed/comm/shared_memory_allreduce.h>

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/torch.h>

#include <lockstep/core/error.h>
#include <lockstep/distributed/collectives.h>

#include "../rank_order_sum.h"
#include "futex_barrier.h"
#include "hosts.h"
#include "shared_memory_segment.h"

namespace lockstep {
namespace distributed {
namespace {

using detail::round_up;

// How long allreduce_here's barriers poll before they sleep: longer than the usual wait for the
// other rank (0.3 ms median for the small MLP, docs/benchmarks.md section 13), short enough that
// a rank waiting out a slow peer on a busy host soon gives its CPU back.
constexpr std::chrono::microseconds kPollOnCallerThread{1000};

// Slots [begin, end) summed in rank order (the kernel every path shares), written back to every slot.
template <typename T>
void sum_part(const std::vector<T*>& slots, int64_t begin, int64_t end, T divisor) {
  if (slots.size() == 2) return detail::sum_pair_into_both(slots[0] + begin, slots[1] + begin, end - begin, divisor);
  const std::vector<const T*> parts(slots.begin(), slots.end());
  alignas(64) T block[detail::kRankOrderBlock];
  for (int64_t start = begin; start < end; start += detail::kRankOrderBlock) {
    const int64_t n = std::min(detail::kRankOrderBlock, end - start);
    detail::sum_block_in_rank_order(parts, start, n, block, divisor);
    for (T* slot : slots) std::memcpy(slot + start, block, static_cast<size_t>(n) * sizeof(T));
  }
}

}  // namespace

// This rank's mapping of its host's segment, and the barrier in the segment's header.
struct SharedMemoryAllreduce::Segment {
  Segment(std::unique_ptr<detail::SharedMemorySegment> mapped, const std::vector<int>& members, int local_rank,
          std::chrono::milliseconds timeout)
      : memory(std::move(mapped)), barrier(memory->header(), members, local_rank, timeout) {}

  std::unique_ptr<detail::SharedMemorySegment> memory;
  detail::FutexBarrier barrier;
};

std::shared_ptr<SharedMemoryAllreduce> SharedMemoryAllreduce::connect(ProcessGroup& group, int64_t bytes_per_rank,
                                                                      const std::string& refused, std::string* why_not,
                                                                      const std::string& host) {
  auto refuse = [&](const std::string& reason) -> std::shared_ptr<SharedMemoryAllreduce> {
    if (why_not) *why_not = reason;
    return nullptr;
  };
  if (group.world_size() < 2) return refuse("a single rank has nothing to share");
  auto joined = detail::join_host_segment(group, detail::slot_bytes_for(bytes_per_rank), refused, host,
                                          "DDP shared memory", false, why_not);
  if (!joined.memory) return nullptr;
  const auto& hosts = joined.hosts;
  const auto& members = joined.members;
  const int local_rank = joined.local_rank;
  const int local_size = static_cast<int>(members.size());
  auto segment = std::make_shared<Segment>(std::move(joined.memory), members, local_rank, group.timeout());
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
  segment_->memory->header().left[local_rank_].store(1, std::memory_order_release);
}

int64_t SharedMemoryAllreduce::bytes_per_rank() const { return segment_->memory->slot_bytes(); }

std::string SharedMemoryAllreduce::describe() const {
  if (!across_) return "shared memory";
  return "shared memory within each host, " + across_->backend_name() + " across " +
         std::to_string(across_->world_size()) + " hosts";
}

at::Tensor SharedMemoryAllreduce::region(int64_t offset, int64_t numel, const at::TensorOptions& options) {
  const int64_t bytes = numel * static_cast<int64_t>(options.dtype().itemsize());
  if (offset % 64 != 0 || offset < 0 || offset + bytes > segment_->memory->slot_bytes()) {
    throw UsageError("SharedMemoryAllreduce::region: bytes [" + std::to_string(offset) + ", " +
                                std::to_string(offset + bytes) + ") are not a 64-byte aligned part of the " +
                                std::to_string(segment_->memory->slot_bytes()) + "-byte slot.");
  }
  auto keep = segment_;
  return torch::from_blob(segment_->memory->slot(local_rank_) + offset, {numel}, [keep](void*) {}, options);
}

SharedMemoryAllreduce::Job SharedMemoryAllreduce::make_job(int64_t offset, at::Tensor tensor, double divisor) {
  const auto dtype = tensor.scalar_type();
  if ((dtype != at::kFloat && dtype != at::kDouble) || !tensor.is_contiguous() || !tensor.device().is_cpu()) {
    throw UsageError("SharedMemoryAllreduce: only contiguous float32 and float64 CPU tensors; got " +
                                tensor.toString() + ".");
  }
  region(offset, tensor.numel(), tensor.options());  // checks the bounds
  return Job{offset, std::move(tensor), divisor, c10::make_intrusive<c10::ivalue::Future>(c10::TensorType::get())};
}

c10::intrusive_ptr<c10::ivalue::Future> SharedMemoryAllreduce::allreduce(int64_t offset, at::Tensor tensor,
                                                                         double divisor) {
  Job job = make_job(offset, std::move(tensor), divisor);
  auto future = job.future;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    jobs_.push_back(std::move(job));
  }
  wake_.notify_one();
  return future;
}

c10::intrusive_ptr<c10::ivalue::Future> SharedMemoryAllreduce::allreduce_here(int64_t offset, at::Tensor tensor,
                                                                              double divisor) {
  Job job = make_job(offset, std::move(tensor), divisor);
  job.on_caller_thread = true;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    // The queued jobs end within their own barriers' timeouts; twice that is a stuck thread.
    if (!idle_.wait_for(lock, 2 * timeout_, [this] { return jobs_.empty() && !busy_; })) {
      throw DistributedError(who_ + ": shared-memory allreduce of a DDP bucket: the buckets before it were not "
                             "reduced within " + std::to_string(2 * timeout_.count()) + " ms.");
    }
    busy_ = true;
  }
  finish(job);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    busy_ = false;
  }
  wake_.notify_one();  // a job queued meanwhile
  return job.future;
}

void SharedMemoryAllreduce::run() {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [this] { return (stopping_ && jobs_.empty()) || (!jobs_.empty() && !busy_); });
      if (jobs_.empty()) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
      busy_ = true;
    }
    finish(job);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      busy_ = false;
    }
    idle_.notify_all();
  }
}

void SharedMemoryAllreduce::finish(const Job& job) {
  try {
    if (!broken_.empty()) throw DistributedError(broken_);
    reduce(job);
    job.future->markCompleted(c10::IValue(job.tensor));
  } catch (const std::exception& e) {
    if (broken_.empty()) broken_ = message_of(e);
    job.future->setError(std::make_exception_ptr(DistributedError(message_of(e))));
  }
}

void SharedMemoryAllreduce::reduce(const Job& job) {
  char* mine = segment_->memory->slot(local_rank_) + job.offset;
  const bool in_place = job.tensor.data_ptr() == mine;
  const size_t bytes = static_cast<size_t>(job.tensor.numel()) * job.tensor.element_size();
  if (!in_place) std::memcpy(mine, job.tensor.data_ptr(), bytes);
  const int64_t described[3] = {job.offset, job.tensor.numel(), static_cast<int64_t>(job.tensor.scalar_type())};
  std::memcpy(segment_->memory->header().job[local_rank_], described, sizeof(described));
  barrier("gradients written", job.on_caller_thread);
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
      const auto unreachable = across_->unreachable_members();
      fail_all(std::string("the sum across hosts (") + across_->describe() + ") failed: " + message_of(e) +
               (unreachable.empty() ? "" : ". Unreachable: " + unreachable));
    }
    part[0].div_(job.divisor);
    for (int r = 0; r < local_size_; ++r) {
      if (r != local_rank_) std::memcpy(segment_->memory->slot(r) + job.offset + begin * element, part[0].data_ptr(),
                                        static_cast<size_t>((end - begin) * element));
    }
  }
  barrier("sums written", job.on_caller_thread);
  // No third barrier: a rank writes its slot again only after the next call's first barrier.
  if (!in_place) std::memcpy(job.tensor.data_ptr(), mine, bytes);
}

void SharedMemoryAllreduce::check_same_job() {
  // Stable until the next barrier, which no rank passes before all have checked.
  const auto describe = [](const int64_t* job) {
    return "offset " + std::to_string(job[0]) + ", " + std::to_string(job[1]) + " " +
           c10::toString(static_cast<at::ScalarType>(job[2])) + " values";
  };
  const int64_t* mine = segment_->memory->header().job[local_rank_];
  for (int r = 0; r < local_size_; ++r) {
    const int64_t* theirs = segment_->memory->header().job[r];
    if (std::equal(mine, mine + 3, theirs)) continue;
    fail_all("ranks reduce different buckets: rank " + std::to_string(members_[local_rank_]) + " has " +
             describe(mine) + ", rank " + std::to_string(members_[r]) + " has " + describe(theirs) +
             ". Every rank must build the same DistributedDataParallel and run the same synchronised backward "
             "passes.");
  }
}

void SharedMemoryAllreduce::fail_all(const std::string& what) {
  uint32_t none = 0;
  segment_->memory->header().aborted_by.compare_exchange_strong(none, static_cast<uint32_t>(local_rank_ + 1));
  throw DistributedError(who_ + ": shared-memory allreduce of a DDP bucket: " + what);
}

void SharedMemoryAllreduce::barrier(const char* phase, bool poll) {
  const std::string failure = segment_->barrier.wait(phase, ++epoch_, stopping_,
                                                     poll ? kPollOnCallerThread : std::chrono::microseconds(0));
  if (!failure.empty()) fail_all(failure);
}

template <typename T>
std::vector<T*> SharedMemoryAllreduce::slots_of(int64_t offset) const {
  std::vector<T*> slots;
  for (int r = 0; r < local_size_; ++r) slots.push_back(reinterpret_cast<T*>(segment_->memory->slot(r) + offset));
  return slots;
}

}  // namespace distributed
}  // namespace lockstep
