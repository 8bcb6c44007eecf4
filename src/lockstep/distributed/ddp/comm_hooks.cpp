#include <lockstep/distributed/ddp/comm_hooks.h>

#include <c10/util/Optional.h>

#include <lockstep/distributed/comm/c10d_transport.h>

namespace lockstep {
namespace distributed {
namespace {

// Averages `bucket` through the transport DDP keeps it with (shared memory or the process
// group's backend), or over `group` for a bucket made outside DDP. `compressed`: the dtype the
// ranks' values are rounded to on their way (the compression hooks); none for the buffer's own.
BucketFuture average(ProcessGroup& group, const GradBucket& bucket, c10::optional<at::ScalarType> compressed) {
  const int world_size = group.world_size();
  C10dTransport over_group(group);
  GradientTransport& transport = bucket.transport() ? *bucket.transport() : over_group;
  if (compressed) return transport.allreduce_mean_compressed(bucket.index(), bucket.buffer(), world_size, *compressed);
  if (world_size == 1) return bucket.buffer();
  if (bucket.is_last()) return transport.allreduce_mean_last(bucket.index(), bucket.buffer(), world_size);
  return transport.allreduce_mean(bucket.index(), bucket.buffer(), world_size);
}

CommHook averaging_hook(c10::optional<at::ScalarType> compressed) {
  return [compressed](ProcessGroup& group, const GradBucket& bucket) { return average(group, bucket, compressed); };
}

}  // namespace

GradBucket::GradBucket(size_t index, bool is_last, at::Tensor buffer, std::vector<at::Tensor> parameters,
                       std::vector<std::string> parameter_names, std::vector<at::Tensor> gradients)
    : index_(index),
      is_last_(is_last),
      buffer_(std::move(buffer)),
      parameters_(std::move(parameters)),
      parameter_names_(std::move(parameter_names)),
      gradients_(std::move(gradients)) {}

CommHook allreduce_mean_hook() { return averaging_hook(c10::nullopt); }

CommHook fp16_compress_hook() { return averaging_hook(at::kHalf); }

CommHook bf16_compress_hook() { return averaging_hook(at::kBFloat16); }

}  // namespace distributed
}  // namespace lockstep
