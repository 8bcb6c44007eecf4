#include "equal_shards.h"

#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/torch.h>

#include <lockstep/core/error.h>

#include "rank_order_sum.h"
#include "wait_for.h"

namespace lockstep {
namespace distributed {
namespace detail {
namespace {

template <typename T>
void sum_rows_typed(const at::Tensor& rows, at::Tensor& shard, double divisor) {
  const int64_t n = shard.numel();
  std::vector<const T*> parts;
  for (int64_t r = 0; r < rows.size(0); ++r) parts.push_back(rows.data_ptr<T>() + r * n);
  sum_in_rank_order<T>(parts, shard.data_ptr<T>(), n, static_cast<T>(divisor));
}

#ifdef USE_C10D_NCCL  // set by the Torch package of a LibTorch built with NCCL (2.x CUDA builds)
// NCCL's own collectives on the group's device: CPU tensors are copied there and back.
void nccl_reduce_scatter(ProcessGroup& group, const at::Tensor& flat, at::Tensor& shard, double divisor,
                         const std::string& what, const CollectiveOptions& options) {
  auto input = flat.to(group.device()).view(-1);
  const bool in_place = shard.device() == group.device();
  auto output = in_place ? shard.view(-1) : torch::empty({shard.numel()}, shard.options().device(group.device()));
  c10d::ReduceScatterOptions o;
  o.reduceOp = c10d::ReduceOp::SUM;
  o.timeout = timeout_of(group, options);
  wait_for(group, group.backend()->_reduce_scatter_base(output, input, o), what, options);
  if (divisor != 1.0) output.div_(divisor);
  if (!in_place) shard.view(-1).copy_(output);
}

void nccl_all_gather(ProcessGroup& group, const at::Tensor& shard, at::Tensor& flat, const std::string& what,
                     const CollectiveOptions& options) {
  auto input = shard.to(group.device()).view(-1);
  const bool in_place = flat.device() == group.device();
  auto output = in_place ? flat.view(-1) : torch::empty({flat.numel()}, flat.options().device(group.device()));
  c10d::AllgatherOptions o;
  o.timeout = timeout_of(group, options);
  wait_for(group, group.backend()->_allgather_base(output, input, o), what, options);
  if (!in_place) flat.view(-1).copy_(output);
}
#endif

// For Gloo, which moves no bfloat16 (LibTorch 1.13; nor int16): its bits as float16, which Gloo
// copies unchanged. The collectives that use it only move data; sums are ours.
at::Tensor movable(const at::Tensor& tensor) {
  return tensor.scalar_type() == at::kBFloat16 ? tensor.view(at::kHalf) : tensor;
}

}  // namespace

void check_equal_shards(int world_size, const std::string& who, const at::Tensor& flat, const at::Tensor& shard,
                        const std::string& call, const std::string& what) {
  std::string problem;
  if (!flat.is_contiguous() || !shard.is_contiguous()) {
    problem = "needs contiguous tensors; call .contiguous() first";
  } else if (flat.scalar_type() != shard.scalar_type() || flat.device() != shard.device()) {
    problem = "flat is " + flat.toString() + " on " + flat.device().str() + ", shard " + shard.toString() + " on " +
              shard.device().str() + "; give both one dtype and device";
  } else if (flat.numel() != world_size * shard.numel()) {
    problem = "flat has " + std::to_string(flat.numel()) + " elements and shard " + std::to_string(shard.numel()) +
              ", but flat must hold world_size (" + std::to_string(world_size) +
              ") equal shards; pad it as FlatLayout does";
  }
  if (!problem.empty()) throw UsageError(who + ": " + call + " (" + what + "): " + problem + ".");
}

void sum_rows_in_rank_order(const at::Tensor& rows, at::Tensor& shard, double divisor) {
  const auto dtype = rows.scalar_type();
  const bool plain = rows.device().is_cpu() && shard.device().is_cpu() && rows.is_contiguous() &&
                     shard.is_contiguous() && shard.scalar_type() == dtype;
  if (plain && dtype == at::kFloat) return sum_rows_typed<float>(rows, shard, divisor);
  if (plain && dtype == at::kDouble) return sum_rows_typed<double>(rows, shard, divisor);
  // Reduced precision (bfloat16, float16) is summed in float32 and rounded once.
  const bool narrow = dtype == at::kBFloat16 || dtype == at::kHalf;
  auto sum = narrow ? rows[0].to(at::kFloat) : rows[0].clone();
  for (int64_t r = 1; r < rows.size(0); ++r) sum.add_(rows[r]);
  if (divisor != 1.0) sum.div_(divisor);
  shard.copy_(sum.view_as(shard));
}

void reduce_scatter_equal_shards(ProcessGroup& group, const at::Tensor& flat, at::Tensor& shard, double divisor,
                                 const std::string& what, const CollectiveOptions& options) {
#ifdef USE_C10D_NCCL
  if (group.backend_name() == "nccl") return nccl_reduce_scatter(group, flat, shard, divisor, what, options);
#endif
  // Gloo has no reduce-scatter (LibTorch 1.13) and would sum in its own order: rank j receives
  // part j of every rank's flat, and sums them in rank order itself.
  if (shard.numel() == 0) return;
  auto input = flat.view(-1);
  auto received = torch::empty_like(input);
  std::vector<int64_t> equal_parts;  // none given: world_size equal parts
  c10d::AllToAllOptions o;
  o.timeout = timeout_of(group, options);
  auto moved_in = movable(received);
  auto moved_out = movable(input);
  wait_for(group, group.backend()->alltoall_base(moved_in, moved_out, equal_parts, equal_parts, o), what, options);
  sum_rows_in_rank_order(received.view({group.world_size(), shard.numel()}), shard, divisor);
}

void all_gather_equal_shards(ProcessGroup& group, const at::Tensor& shard, at::Tensor& flat, const std::string& what,
                             const CollectiveOptions& options) {
#ifdef USE_C10D_NCCL
  if (group.backend_name() == "nccl") return nccl_all_gather(group, shard, flat, what, options);
#endif
  // Gloo (1.13) has no flat all-gather: the list form, into views of `flat`.
  const int64_t n = shard.numel();
  if (n == 0) return;
  auto whole = movable(flat.view(-1));
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int r = 0; r < group.world_size(); ++r) outputs[0].push_back(whole.narrow(0, r * n, n));
  std::vector<at::Tensor> inputs{movable(shard.view(-1))};
  c10d::AllgatherOptions o;
  o.timeout = timeout_of(group, options);
  wait_for(group, group.backend()->allgather(outputs, inputs, o), what, options);
}

}  // namespace detail
}  // namespace distributed
}  // namespace lockstep
