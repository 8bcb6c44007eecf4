#pragma once
// The shared memory of one host's ranks, for the shared-memory allreduce: a memfd that the host's
// first rank creates and the others map through /proc, a header, then one slot per rank
// (not installed).

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

namespace lockstep {
namespace distributed {
namespace detail {

constexpr int kMaxRanks = 256;  // ranks on one host that a segment has room for

/// `n` rounded up to a multiple of `to`.
constexpr int64_t round_up(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

/// The segment's first pages: a cross-process barrier and who is attached. No lock guards it: the
/// host's ranks share it across processes, and each writes only its own entries of the per-slot
/// arrays (from its communication thread; `left` also from leave()), the barrier's count and
/// generation, and aborted_by once, when it fails.
struct SegmentHeader {
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

/// One rank's mapping of its host's segment, unmapped when this goes. It guards nothing: the
/// mapping stays fixed while it lives, and the collective orders who touches the memory.
class SharedMemorySegment {
 public:
  /// Takes over `base`, a mapping of `bytes` whose slots hold `slot_bytes` each.
  SharedMemorySegment(char* base, int64_t bytes, int64_t slot_bytes);
  ~SharedMemorySegment();
  SharedMemorySegment(const SharedMemorySegment&) = delete;
  SharedMemorySegment& operator=(const SharedMemorySegment&) = delete;

  SegmentHeader& header() const { return *reinterpret_cast<SegmentHeader*>(base_); }
  char* slot(int rank) const;
  int64_t slot_bytes() const { return slot_bytes_; }

 private:
  char* base_;
  int64_t bytes_;
  int64_t slot_bytes_;
};

/// A slot's size for `bytes_per_rank`: whole pages, at least 64 bytes.
int64_t slot_bytes_for(int64_t bytes_per_rank);

/// A new memfd with `slots` slots of `slot_bytes`, mapped, its header set up; `offer` gets the
/// path the other ranks open it by and the token that proves it. nullptr and `error` if it
/// cannot be made. `fd` is left open (or -1): the others open the memfd through it.
std::unique_ptr<SharedMemorySegment> create_segment(int slots, int64_t slot_bytes, int* fd, nlohmann::json* offer,
                                                    std::string* error);
/// The segment that its host's first rank offered (`path`, `token`), mapped; it must have
/// `slots` slots of `slot_bytes`. nullptr and `error` if it cannot be opened or is not that
/// segment; `fd` is left open (or -1).
std::unique_ptr<SharedMemorySegment> attach_segment(const std::string& path, uint64_t token, int slots,
                                                    int64_t slot_bytes, int* fd, std::string* error);

}  // namespace detail
}  // namespace distributed
}  // namespace lockstep
