#include "shared_memory_segment.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>

#include <fcntl.h>

namespace lockstep {
namespace distributed {
namespace detail {
namespace {

constexpr int64_t kPage = 4096;

constexpr int64_t kHeaderBytes = round_up(sizeof(SegmentHeader), kPage);

std::string errno_text(const std::string& call) { return call + ": " + std::strerror(errno); }

char* map_shared(int fd, int64_t bytes, std::string* error) {
  void* p = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p != MAP_FAILED) return static_cast<char*>(p);
  *error = errno_text("mmap");
  return nullptr;
}

int64_t segment_bytes(int slots, int64_t slot_bytes) { return kHeaderBytes + slot_bytes * slots; }

}  // namespace

int64_t slot_bytes_for(int64_t bytes_per_rank) { return round_up(std::max<int64_t>(bytes_per_rank, 64), kPage); }

std::unique_ptr<SharedMemorySegment> create_segment(int slots, int64_t slot_bytes, int* fd, nlohmann::json* offer,
                                                    std::string* error) {
  const int64_t bytes = segment_bytes(slots, slot_bytes);
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
  auto* header = new (base) SegmentHeader();
  header->token = token;
  header->world_size = slots;
  (*offer)["path"] = "/proc/" + std::to_string(getpid()) + "/fd/" + std::to_string(*fd);
  (*offer)["token"] = token;
  return std::make_unique<SharedMemorySegment>(base, bytes, slot_bytes);
}

std::unique_ptr<SharedMemorySegment> attach_segment(const std::string& path, uint64_t token, int slots,
                                                    int64_t slot_bytes, int* fd, std::string* error) {
  const int64_t bytes = segment_bytes(slots, slot_bytes);
  struct stat opened {};
  if ((*fd = open(path.c_str(), O_RDWR | O_CLOEXEC)) < 0) {
    *error = errno_text("open " + path);
    return nullptr;
  }
  if (fstat(*fd, &opened) != 0) {
    *error = errno_text("fstat " + path);
    return nullptr;
  }
  if (opened.st_size != bytes) {
    // Mapping more than the file holds would end in SIGBUS at the first touch.
    *error = "its host's segment holds " + std::to_string(opened.st_size) + " bytes, this rank needs " +
             std::to_string(bytes) + " bytes (ranks of one host disagree on the buckets' size)";
    return nullptr;
  }
  char* base = map_shared(*fd, bytes, error);
  if (!base) return nullptr;
  auto segment = std::make_unique<SharedMemorySegment>(base, bytes, slot_bytes);
  if (segment->header().token != token) {
    *error = "not its host's segment";
    return nullptr;
  }
  return segment;
}

SharedMemorySegment::SharedMemorySegment(char* base, int64_t bytes, int64_t slot_bytes)
    : base_(base), bytes_(bytes), slot_bytes_(slot_bytes) {}

SharedMemorySegment::~SharedMemorySegment() { munmap(base_, static_cast<size_t>(bytes_)); }

char* SharedMemorySegment::slot(int rank) const { return base_ + kHeaderBytes + slot_bytes_ * rank; }

}  // namespace detail
}  // namespace distributed
}  // namespace lockstep
