#include <lockstep/distributed/comm/shard_transport.h>

#include <cstdlib>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/torch.h>

#include <lockstep/core/error.h>
#include <lockstep/distributed/comm/shared_memory_shard_transport.h>

#include "../wait_for.h"
#include "../equal_shards.h"
#include "shard_checks.h"

namespace lockstep {
namespace distributed {
namespace {

class C10dShardTransport : public ShardTransport {
 public:
  explicit C10dShardTransport(ProcessGroup& group) : group_(group) {}
  std::string name() const override { return group_.backend_name(); }

  void reduce_scatter(const FlatSegments& flat, at::Tensor& shard, double divisor, const std::string& what) override {
    detail::check_equal_shards(group_.world_size(), group_.describe(), flat, shard, "reduce_scatter", what);
    detail::reduce_scatter_equal_shards(group_, flat.joined(shard.options()), shard, divisor, what, CollectiveOptions());
  }

  void all_gather(const at::Tensor& shard, at::Tensor& flat, const std::string& what) override {
    detail::check_equal_shards(group_.world_size(), group_.describe(), flat, shard, "all_gather", what);
    detail::all_gather_equal_shards(group_, shard, flat, what, CollectiveOptions());
  }

 private:
  ProcessGroup& group_;
};

}  // namespace

FlatSegments::FlatSegments(const at::Tensor& flat) : numel(flat.numel()), tensors{flat}, offsets{0} {}

FlatSegments::FlatSegments(int64_t numel, std::vector<at::Tensor> tensors, std::vector<int64_t> offsets)
    : numel(numel), tensors(std::move(tensors)), offsets(std::move(offsets)) {
  if (this->tensors.size() != this->offsets.size()) {
    throw UsageError("FlatSegments: " + std::to_string(this->tensors.size()) + " tensors but " +
                     std::to_string(this->offsets.size()) + " offsets; give one offset per tensor.");
  }
}

at::Tensor FlatSegments::joined(const at::TensorOptions& options) const {
  if (whole()) return tensors[0];
  auto flat = torch::zeros({numel}, options);
  for (size_t i = 0; i < tensors.size(); ++i) flat.narrow(0, offsets[i], tensors[i].numel()).copy_(tensors[i].view(-1));
  return flat;
}

namespace detail {

void check_equal_shards(int world_size, const std::string& who, const FlatSegments& flat, const at::Tensor& shard,
                        const std::string& call, const std::string& what) {
  if (flat.whole()) return check_equal_shards(world_size, who, flat.tensors[0], shard, call, what);
  std::string problem;
  int64_t end = 0;
  for (size_t i = 0; i < flat.tensors.size() && problem.empty(); ++i) {
    const auto& segment = flat.tensors[i];
    if (!segment.is_contiguous() || segment.scalar_type() != shard.scalar_type() || segment.device() != shard.device()) {
      problem = "segment " + std::to_string(i) + " is " + segment.toString() + " on " + segment.device().str() +
                (segment.is_contiguous() ? "" : ", not contiguous") + ", the shard " + shard.toString() + " on " +
                shard.device().str() + "; give contiguous segments of the shard's dtype and device";
    } else if (flat.offsets[i] < end || flat.offsets[i] + segment.numel() > flat.numel) {
      problem = "segment " + std::to_string(i) + " (elements " + std::to_string(flat.offsets[i]) + " to " +
                std::to_string(flat.offsets[i] + segment.numel()) + ") overlaps the one before it or ends past the " +
                "flat's " + std::to_string(flat.numel) + " elements; give segments in ascending order, apart";
    }
    end = flat.offsets[i] + segment.numel();
  }
  if (problem.empty() && flat.numel != world_size * shard.numel()) {
    problem = "flat has " + std::to_string(flat.numel) + " elements and shard " + std::to_string(shard.numel()) +
              ", but flat must hold world_size (" + std::to_string(world_size) +
              ") equal shards; pad it as FlatLayout does";
  }
  if (!problem.empty()) throw UsageError(who + ": " + call + " (" + what + "): " + problem + ".");
}

std::string shared_memory_unsuitable(const ProcessGroup& group, bool allowed, const std::string& off_by) {
  if (!allowed) return "turned off " + off_by;
  const char* env = std::getenv("LOCKSTEP_DDP_SHARED_MEMORY");
  if (env && std::string(env) == "0") return "turned off by LOCKSTEP_DDP_SHARED_MEMORY=0";
  if (!group.device().is_cpu()) return "the process group's device is " + group.device().str();
  return "";
}

}  // namespace detail

void ShardTransport::reduce_scatter_add(const FlatSegments& flat, at::Tensor& shard, double divisor,
                                        const std::string& what) {
  auto part = at::empty_like(shard);
  reduce_scatter(flat, part, divisor, what);
  shard.add_(part);
}

std::shared_ptr<ShardTransport> c10d_shard_transport(ProcessGroup& group) {
  return std::make_shared<C10dShardTransport>(group);
}

std::shared_ptr<ShardTransport> choose_shard_transport(ProcessGroup& group, int64_t max_flat_bytes,
                                                       bool shared_memory, std::string* why_not) {
  std::string reason;
  if (group.world_size() < 2) {
    reason = "a single rank has nothing to share";
  } else if (auto memory = SharedMemoryShardTransport::connect(group, max_flat_bytes,
                                                                detail::shared_memory_unsuitable(group, shared_memory, "by the caller"), &reason)) {
    if (why_not) why_not->clear();
    return memory;
  }
  if (why_not) *why_not = reason;
  return c10d_shard_transport(group);
}

}  // namespace distributed
}  // namespace lockstep
