#include <lockstep/distributed/comm/gradient_transport.h>

#include <iostream>
#include <mutex>
#include <set>

#include <torch/torch.h>

#include <lockstep/core/error.h>
#include <lockstep/distributed/comm/c10d_transport.h>
#include <lockstep/distributed/comm/shared_memory_transport.h>

#include "shard_checks.h"

namespace lockstep {
namespace distributed {
namespace {

// Why these parameters' buckets cannot live in shared memory, or "" if they can.
std::string shared_memory_unsuitable(const ProcessGroup& group, const std::vector<at::Tensor>& params, bool allowed) {
  const auto why = detail::shared_memory_unsuitable(group, allowed, "in DDPOptions");
  if (!why.empty()) return why;
  for (const auto& p : params) {
    if (!p.device().is_cpu()) return "parameters not on the CPU";
    if (p.scalar_type() != at::kFloat && p.scalar_type() != at::kDouble) return "parameters not float32/float64";
  }
  return "";
}

// Once per reason and process: a GAN's two DDPs, or a test's many, would repeat it.
void say_once(const ProcessGroup& group, const std::string& why_not) {
  static std::mutex said_mutex;
  static std::set<std::string> said;
  std::lock_guard<std::mutex> lock(said_mutex);
  if (!said.insert(why_not).second) return;
  std::cerr << "lockstep: DDP averages gradients through " << group.backend_name()
            << ", not shared memory: " << why_not << ".\n";
}

}  // namespace

BucketFuture GradientTransport::allreduce_mean_compressed(size_t bucket, const at::Tensor& buffer, double divisor,
                                                          at::ScalarType compressed) {
  if (compressed != at::kHalf && compressed != at::kBFloat16) {
    throw UsageError("allreduce_mean_compressed: gradients travel compressed as float16 or bfloat16, not " +
                     std::string(c10::toString(compressed)) + "; use fp16_compress_hook() or bf16_compress_hook(), "
                     "or allreduce_mean_hook() for no compression.");
  }
  buffer.copy_(buffer.to(compressed));
  return allreduce_mean(bucket, buffer, divisor);
}

std::shared_ptr<GradientTransport> choose_gradient_transport(ProcessGroup& group,
                                                             const std::vector<at::Tensor>& parameters,
                                                             bool shared_memory, std::string* why_not) {
  why_not->clear();
  if (group.world_size() < 2) {
    *why_not = "a single rank has nothing to share";
    return std::make_shared<C10dTransport>(group);
  }
  // A collective on every rank (each says whether it can), so that all ranks agree.
  auto memory = SharedMemoryAllreduce::connect(group, SharedMemoryTransport::slot_bytes(parameters),
                                               shared_memory_unsuitable(group, parameters, shared_memory), why_not);
  if (memory) return std::make_shared<SharedMemoryTransport>(std::move(memory));
  if (group.rank() == 0) say_once(group, *why_not);
  return std::make_shared<C10dTransport>(group);
}

}  // namespace distributed
}  // namespace lockstep
