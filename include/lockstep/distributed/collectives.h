#pragma once
/// Collectives over a ProcessGroup, each bounded by a timeout and named in its error messages.

#include <chrono>
#include <string>
#include <vector>

#include <ATen/core/ivalue.h>
#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>
#include <torch/arg.h>

#include <lockstep/distributed/process_group.h>

namespace lockstep {
namespace distributed {

/// How all_reduce combines the ranks' values. `mean` is the default, as in Lightning Fabric.
enum class ReduceOp { sum, mean, max, min, product };

/// "sum|mean|max|min|product" (also "avg"); anything else throws UsageError naming
/// the valid ones.
ReduceOp parse_reduce_op(const std::string& name);
std::string to_string(ReduceOp op);

/// Per-call options. The timeout bounds the wait so that a rank that never arrives turns into
/// an error naming this call instead of a hang; the tag names the call in that error (as Gloo's
/// collectives take a tag), e.g. "sync_dist train_loss".
struct CollectiveOptions {
  /// Name of the call in messages. Default: "" (the operation's name alone).
  TORCH_ARG(std::string, tag) = "";
  /// Wait at most this long; zero means the group's timeout. Default: 0.
  TORCH_ARG(std::chrono::milliseconds, timeout) = std::chrono::milliseconds(0);
};

/// Reduces `tensor` in place across the group and returns it. Integer tensors with `mean`
/// are rejected (the mean of integers is not an integer).
at::Tensor all_reduce(ProcessGroup& group, at::Tensor tensor, ReduceOp op = ReduceOp::mean,
                      const CollectiveOptions& options = {});

/// Every rank's tensor, in rank order. Shapes may differ in the first dimension across ranks;
/// the other dimensions and the dtype must agree (checked, with a message naming the rank).
std::vector<at::Tensor> all_gather(ProcessGroup& group, const at::Tensor& tensor,
                                   const CollectiveOptions& options = {});

/// all_gather stacked into one tensor of shape (world_size, ...), as Lightning Fabric returns;
/// needs equal shapes on every rank.
at::Tensor all_gather_stacked(ProcessGroup& group, const at::Tensor& tensor,
                              const CollectiveOptions& options = {});

/// This rank's part of `flat` reduced over the ranks, as torch.distributed.reduce_scatter_tensor
/// with an uneven last part: `flat` (the same numel and dtype on every rank, taken as 1-D) is
/// split into parts of ceil(numel / world_size) elements, so the last ranks' parts are shorter
/// or empty. Only ReduceOp::sum and ReduceOp::mean (others throw UsageError). Sums run in rank
/// order over Gloo, so every run gives the same bits.
///
///   auto part = reduce_scatter(group, grads, ReduceOp::mean);  // 10 values, 4 ranks: 3, 3, 3, 1
at::Tensor reduce_scatter(ProcessGroup& group, const at::Tensor& flat, ReduceOp op = ReduceOp::mean,
                          const CollectiveOptions& options = {});

/// Every rank's `shard` into `flat`, in rank order, and returns `flat`: the inverse of
/// reduce_scatter's split. Each rank gives its part of flat's numel by the same rule (rank r:
/// elements [r * ceil(numel / world_size), ...), the last ranks' parts shorter or empty);
/// `flat` has the same numel and dtype on every rank and must be contiguous.
at::Tensor all_gather_into(ProcessGroup& group, const at::Tensor& shard, at::Tensor flat,
                           const CollectiveOptions& options = {});

/// Overwrites `tensor` on every rank with rank `src`'s (same shape and dtype on every rank), as
/// torch.distributed.broadcast does; returns it.
at::Tensor broadcast_tensor(ProcessGroup& group, at::Tensor tensor, int src = 0,
                            const CollectiveOptions& options = {});

/// Rank `src`'s value on every rank: tensors, strings, numbers, bools, lists and dicts of them
/// (anything torch::pickle_save accepts). Other ranks' `value` is ignored.
c10::IValue broadcast(ProcessGroup& group, const c10::IValue& value, int src = 0,
                      const CollectiveOptions& options = {});
/// broadcast for JSON values.
nlohmann::json broadcast_json(ProcessGroup& group, const nlohmann::json& value, int src = 0,
                              const CollectiveOptions& options = {});

/// Blocks until every rank reached the barrier of the same `name`. On timeout the error says
/// which ranks did not arrive. Barriers of one name are counted, so they may repeat.
void barrier(ProcessGroup& group, const std::string& name, const CollectiveOptions& options = {});

/// How reduce_boolean_decision combines the ranks' decisions.
enum class Decision { all, any };

/// Combines one bool per rank: `all` is true only if every rank says true, `any` if one does.
/// (EarlyStopping uses it so that every rank stops at the same step.)
bool reduce_boolean_decision(ProcessGroup& group, bool decision, Decision rule = Decision::all,
                             const CollectiveOptions& options = {});

}  // namespace distributed
}  // namespace lockstep
