#pragma once
/// The reducer: DistributedDataParallel's gradient engine. It groups parameters into buckets,
/// hooks each parameter's gradient accumulator, launches a bucket's reduction as soon as its last
/// gradient arrives (while backward still runs), and at the end of backward waits for the
/// buckets and writes the averaged gradients back.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>
#include <torch/csrc/autograd/variable.h>

#include <lockstep/core/libtorch_compat.h>
#include <lockstep/distributed/comm/gradient_transport.h>
#include <lockstep/distributed/ddp/comm_hooks.h>
#include <lockstep/distributed/ddp/ddp_options.h>
#include <lockstep/distributed/distributed_error.h>
#include <lockstep/distributed/process_group.h>

namespace torch {
namespace autograd {
struct Node;
}  // namespace autograd
}  // namespace torch

namespace lockstep {
namespace distributed {

/// Every autograd node a backward from `outputs` would run, the parameters' gradient
/// accumulators included (how find_unused_parameters tells used from unused parameters).
std::unordered_set<const torch::autograd::Node*> autograd_nodes_reached_by(const std::vector<at::Tensor>& outputs);

/// When one bucket's gradients were ready, its reduction launched and finished, measured from
/// the first gradient of the backward pass.
struct BucketTrace {
  size_t index = 0;
  size_t parameters = 0;
  int64_t bytes = 0;
  /// Its last gradient arrived.
  std::chrono::nanoseconds ready{0};
  /// Its comm hook was called (at `ready`, or later if an earlier bucket was not ready yet).
  std::chrono::nanoseconds launched{0};
  /// Its communication completed (on the communication thread, or in the hook: reduced_in_hook).
  std::chrono::nanoseconds reduced{0};
  /// It had completed when the comm hook returned: reduced on the backward thread (shared
  /// memory's last bucket), so nothing overlapped it and autograd's own work ended at `launched`.
  bool reduced_in_hook = false;
};

/// The timeline of one synchronised backward pass, for overlap measurements: a bucket that was
/// launched before `backward_end` overlapped with backward.
struct ReducerTrace {
  /// Count of synchronised backward passes so far, this one included (1 for the first).
  int64_t step = 0;
  /// When the first gradient arrived (the zero of the other times).
  std::chrono::steady_clock::time_point backward_start;
  /// When autograd finished backward and the reducer started waiting.
  std::chrono::nanoseconds backward_end{0};
  /// When the gradients were written back.
  std::chrono::nanoseconds finished{0};
  std::vector<BucketTrace> buckets;
};

/// Reduces the gradients of `parameters` across `group` in every backward pass that follows a
/// prepare_for_backward(): it orders the buckets, hands full ones to the transport and writes
/// the results back. DistributedDataParallel owns one; use it directly only to build another
/// wrapper. `group` must outlive the reducer.
class Reducer {
 public:
  /// `parameters` are leaves that require grad, with their names for messages; `transport`
  /// holds and reduces the buckets (see choose_gradient_transport).
  Reducer(std::vector<at::Tensor> parameters, std::vector<std::string> names, ProcessGroup& group,
          DDPOptions options, std::shared_ptr<GradientTransport> transport);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  /// Call before each forward: fails if the previous backward's reduction did not finish, ends
  /// sync_every_backward(), and, once after the first synchronised step and with grad mode on,
  /// rebuilds the buckets in the order gradients arrived (rank 0's order, broadcast; a collective).
  void prepare_for_forward();
  /// Call after each forward with its outputs. If `sync`, the next backward reduces the
  /// gradients (a forward with grad mode off builds no graph and changes nothing); otherwise
  /// they only accumulate locally until the next call. A gradient that arrives with neither (no
  /// forward through the wrapper since the last synchronised backward) is an error: it would
  /// stay local and the replicas would drift apart. `outputs_known` false: the outputs could not
  /// be found, so parameters unused in the backward are found at its end instead.
  void prepare_for_backward(const std::vector<at::Tensor>& outputs, bool sync, bool outputs_known = true);
  /// Until the next prepare_for_forward(), every backward is synchronised (`sync`) or local,
  /// whatever the forwards: for callers that do not see the forward's outputs. Parameters
  /// unused in a backward are found at its end (find_unused_parameters / static_graph).
  void sync_every_backward(bool sync);

  /// Under a Join: how many ranks contribute to the next backward's gradients. Reduced buckets
  /// (the comm hook's mean over the world size) are rescaled to the mean over these ranks.
  /// Default: the world size (no rescaling).
  void set_contributing_ranks(int ranks);
  /// On a rank that has joined: the collectives of one synchronised backward with zero gradients
  /// (each bucket through the comm hook, in launch order, then the map of used parameters if
  /// this step shares one), so that the ranks still training are answered. Counts as a step.
  void join_backward();

  /// The timeline of the last synchronised backward.
  const ReducerTrace& last_trace() const { return trace_; }
  /// The buckets as indices into the parameters, in launch order.
  std::vector<std::vector<size_t>> bucket_indices() const;
  /// The bucket buffers (for tests: with gradient_as_bucket_view, grads are views into them).
  std::vector<at::Tensor> bucket_buffers() const;
  /// Where the buckets live and how they are averaged ("shared memory", "gloo").
  const GradientTransport& transport() const { return *transport_; }
  /// Parameters found unused by the last prepare_for_backward (find_unused_parameters).
  std::vector<std::string> unused_parameter_names() const;
  const std::vector<std::string>& parameter_names() const { return names_; }

 private:
  struct Bucket;

  void build_buckets(const std::vector<std::vector<size_t>>& assignment);
  std::unique_ptr<GradBucket> make_grad_bucket(size_t b, const at::Tensor& buffer) const;
  void finish_step();
  void autograd_hook(size_t index);
  void start_backward();
  void mark_ready(size_t index);
  void copy_grad_to_bucket(size_t index, const at::Tensor& view);
  void launch_ready_buckets();
  /// The allreduce of the map of used parameters (find_unused_parameters / static_graph): its start,
  /// and its wait (a failure names `who`), which leaves the summed map in local_used_.
  void start_usage_allreduce();
  void finish_usage_allreduce(const std::string& who);
  void launch(size_t bucket);
  void finalize_backward();
  /// Waits for bucket `b`'s reduction and leaves the mean in the bucket: copied in when the comm
  /// hook returned it elsewhere, rescaled under a Join, its finishing time traced.
  void wait_for_bucket(size_t b);
  void write_back();
  void rebuild_buckets();
  void find_unused(const std::vector<at::Tensor>& outputs);
  bool searches_usage() const;
  /// Readies the buckets for a synchronised backward; `outputs` null: unknown, so unused
  /// parameters are found at the end of the backward.
  void arm(const std::vector<at::Tensor>* outputs);
  /// Marks the parameters that got no gradient in this backward (outputs were unknown).
  void mark_unused_at_end();
  [[noreturn]] void refuse_second_backward(size_t index);
  [[noreturn]] void refuse_unarmed_backward(size_t index);
  std::string bucket_name(size_t bucket) const;
  [[noreturn]] void fail(const std::string& message);
  std::chrono::nanoseconds since_start() const;

  std::vector<at::Tensor> params_;
  std::vector<std::string> names_;
  ProcessGroup& group_;
  DDPOptions options_;
  std::vector<libtorch::GradAccumulator> accumulators_;
  std::vector<uintptr_t> hook_keys_;

  std::vector<Bucket> buckets_;
  std::vector<std::pair<size_t, size_t>> locator_;  // parameter -> (bucket, slot)
  std::shared_ptr<GradientTransport> transport_;  // the buckets' memory and their reduction

  // Guards the step's state below (ready_, each bucket's pending count and future,
  // next_to_launch_, failure_, the usage maps, the trace). autograd_hook runs on autograd's
  // threads, finalize_backward on the thread that ran backward (Engine::queue_callback), the
  // forward/backward preparation on the caller's; communication threads touch only each
  // bucket's atomic reduced_at (BucketFuture::on_completion).
  mutable std::mutex mutex_;
  bool expect_hooks_ = false;
  bool backward_started_ = false;
  bool synchronised_backward_done_ = false;  // until the next forward: another backward is an error
  bool local_window_ = false;    // the last forward ran under no_sync: backward accumulates locally
  bool every_backward_ = false;  // sync_every_backward(true): re-armed after each backward
  bool usage_at_end_ = false;    // this backward's outputs are unknown: unused found at its end
  std::vector<bool> ready_;
  size_t next_to_launch_ = 0;
  std::string failure_;

  // find_unused_parameters / static_graph
  bool track_usage_ = false;           // this iteration allreduces the usage map
  std::vector<size_t> unused_;         // locally unused this iteration
  at::Tensor local_used_;              // int32 per parameter
  at::Tensor used_on_device_;          // what the usage allreduce reduces: local_used_ or its copy
  c10::intrusive_ptr<c10d::Work> used_work_;
  at::Tensor global_used_;             // after the usage allreduce; undefined: all used
  bool static_usage_known_ = false;

  // Rebuilding buckets from the arrival order of the first step.
  std::vector<size_t> arrival_order_;
  bool rebuild_pending_ = false;
  bool has_rebuilt_ = false;

  int contributing_ranks_ = 0;  // 0: the world size

  int64_t steps_ = 0;
  ReducerTrace trace_;
};

}  // namespace distributed
}  // namespace lockstep
