#include <lockstep/core/error.h>
#include <lockstep/distributed/collectives.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <iostream>
#include <map>
#include <sstream>
#include <stdexcept>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/serialize.h>
#include <torch/torch.h>

#include "equal_shards.h"
#include "wait_for.h"

namespace lockstep {
namespace distributed {
namespace {

using detail::call_name;
using detail::seconds;
using detail::timeout_of;
using detail::wait_for;

// The ranks r whose key `prefix + r` is in the store (arrived), and those whose is not, each as
// "0, 2" ("" for none): who reached a barrier or a checked collective.
struct Arrivals {
  std::string missing, arrived;
};
Arrivals arrivals(c10d::Store& store, const std::string& prefix, int world_size) {
  Arrivals lists;
  for (int r = 0; r < world_size; ++r) {
    auto& list = store.check({prefix + std::to_string(r)}) ? lists.arrived : lists.missing;
    list += (list.empty() ? "" : ", ") + std::to_string(r);
  }
  return lists;
}

c10d::ReduceOp c10d_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::mean:
      return c10d::ReduceOp::SUM;
    case ReduceOp::max:
      return c10d::ReduceOp::MAX;
    case ReduceOp::min:
      return c10d::ReduceOp::MIN;
    case ReduceOp::product:
      return c10d::ReduceOp::PRODUCT;
  }
  throw UsageError("ReduceOp " + std::to_string(static_cast<int>(op)) +
                   " is not one of sum, mean, max, min, product; pass a ReduceOp value or parse_reduce_op(name).");
}

// NCCL reduces CUDA tensors only: a CPU tensor goes through the group's device (and back, by the
// caller). Gloo's device is the CPU, so there every tensor stays where it is.
// A buffer that the process group fills from its own thread (Gloo's allgather copies into it
// there), where the caller's InferenceMode does not reach: an ordinary tensor, so that the copy
// is allowed when the caller evaluates under InferenceMode (the Trainer's default).
at::Tensor output_buffer_like(const at::Tensor& tensor) {
  c10::InferenceMode ordinary(false);
  return torch::empty_like(tensor);
}

at::Tensor on_group_device(const ProcessGroup& group, const at::Tensor& tensor) {
  return group.device().is_cuda() && !tensor.is_cuda() ? tensor.to(group.device()) : tensor;
}

// "Float [2, 3]"; with `free_first`, "Float [*, 3]" (all_gather lets the first dimension differ).
std::string shape_of(const at::Tensor& tensor, bool free_first = false) {
  std::string text = std::string(c10::toString(tensor.scalar_type())) + " [";
  for (int64_t d = 0; d < tensor.dim(); ++d) {
    text += (d ? ", " : "") + (d == 0 && free_first ? std::string("*") : std::to_string(tensor.size(d)));
  }
  return text + "]";
}

// ProcessGroup::checks_collectives: before the call, the ranks all-gather what each is about to run
// (its first kCallBytes characters) under the group's next collective number; a difference is an
// error on every rank naming both calls, at once rather than at the timeout (as PyTorch's
// TORCH_DISTRIBUTED_DEBUG=DETAIL does). Through the backend, not the store: a FileStore polls
// every 10 ms.
constexpr int64_t kCallBytes = 256;

void check_same_call(ProcessGroup& group, const std::string& call, const CollectiveOptions& options) {
  if (!group.checks_collectives()) return;
  const int64_t number = group.next_collective_number();
  const std::string here = "rank " + std::to_string(group.rank()) + " is in " + call + " #" + std::to_string(number);
  auto mine = torch::zeros({kCallBytes}, torch::kUInt8);
  std::memcpy(mine.data_ptr(), call.data(), std::min<size_t>(call.size(), kCallBytes - 1));
  std::vector<at::Tensor> in{on_group_device(group, mine)};
  std::vector<std::vector<at::Tensor>> out(1);
  for (int r = 0; r < group.world_size(); ++r) out[0].push_back(output_buffer_like(in[0]));
  c10d::AllgatherOptions go;
  go.timeout = timeout_of(group, options);
  // Arrivals in the store, for the line a rank that waits long prints.
  auto& store = *group.store();
  const std::string arrived = "arrived/" + std::to_string(number) + "/";
  store.set(arrived + std::to_string(group.rank()), std::vector<uint8_t>(call.begin(), call.end()));
  const auto who_arrived = [&] {
    const auto lists = arrivals(store, arrived, group.world_size());
    if (lists.missing.empty()) return std::string("every rank arrived, and one may have died since");
    return "rank(s) " + lists.missing + " have not arrived (rank(s) " + lists.arrived + " have)";
  };
  wait_for(group, group.backend()->allgather(out, in, go), "the check of collective #" + std::to_string(number) +
           " (" + call + ")", CollectiveOptions(options).tag(""), who_arrived);
  const std::string sent(static_cast<const char*>(mine.data_ptr()));
  for (int r = 0; r < group.world_size(); ++r) {
    const auto theirs_bytes = out[0][r].cpu();
    const std::string theirs(static_cast<const char*>(theirs_bytes.data_ptr()));
    if (theirs != sent) {
      throw DistributedError(group.describe() + ": collectives differ: rank " + std::to_string(r) + " is in " + theirs +
                             " #" + std::to_string(number) + " while " + here +
                             ". Every rank must make the same collective calls in the same order "
                             "(LOCKSTEP_DISTRIBUTED_DEBUG=detail compared them).");
    }
  }
}

// broadcast_tensor once the call is checked.
at::Tensor broadcast_unchecked(ProcessGroup& group, at::Tensor tensor, int src, const CollectiveOptions& options) {
  std::vector<at::Tensor> tensors{on_group_device(group, tensor)};
  c10d::BroadcastOptions bo;
  bo.rootRank = src;
  bo.timeout = timeout_of(group, options);
  wait_for(group, group.backend()->broadcast(tensors, bo), "broadcast", options);
  if (!tensors[0].is_same(tensor)) tensor.copy_(tensors[0]);
  return tensor;
}

// Broadcasts a byte string from src (sizes first, so receivers can allocate).
std::string broadcast_bytes(ProcessGroup& group, std::string bytes, int src,
                            const CollectiveOptions& options) {
  auto size = torch::tensor({static_cast<int64_t>(bytes.size())}, torch::kInt64);
  const int64_t n = broadcast_unchecked(group, size, src, options).item<int64_t>();
  auto data = torch::empty({n}, torch::kUInt8);
  if (group.rank() == src) std::memcpy(data.data_ptr(), bytes.data(), bytes.size());
  broadcast_unchecked(group, data, src, options);
  return std::string(reinterpret_cast<const char*>(data.data_ptr()), static_cast<size_t>(n));
}

void check_source(const ProcessGroup& group, int src) {
  if (src < 0 || src >= group.world_size()) {
    throw UsageError(group.describe() + ": broadcast from src=" + std::to_string(src) +
                                ", outside 0.." + std::to_string(group.world_size() - 1) + ".");
  }
}

}  // namespace

ReduceOp parse_reduce_op(const std::string& name) {
  static const std::map<std::string, ReduceOp> ops{{"sum", ReduceOp::sum},   {"mean", ReduceOp::mean},
                                                   {"avg", ReduceOp::mean},  {"max", ReduceOp::max},
                                                   {"min", ReduceOp::min},   {"product", ReduceOp::product}};
  const auto it = ops.find(name);
  if (it == ops.end()) {
    throw UsageError("reduce op '" + name + "' is unknown: use sum, mean, max, min or product.");
  }
  return it->second;
}

std::string to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::mean: return "mean";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
    case ReduceOp::product: return "product";
  }
  return "?";
}

at::Tensor all_reduce(ProcessGroup& group, at::Tensor tensor, ReduceOp op, const CollectiveOptions& options) {
  if (op == ReduceOp::mean && !at::isFloatingType(tensor.scalar_type())) {
    throw UsageError(group.describe() + ": all_reduce mean of a " +
                                std::string(c10::toString(tensor.scalar_type())) +
                                " tensor: convert it to float first, or use ReduceOp::sum.");
  }
  if (!tensor.is_contiguous()) {
    throw UsageError(group.describe() + ": all_reduce needs a contiguous tensor; call .contiguous() first.");
  }
  check_same_call(group, call_name("all_reduce(" + to_string(op) + ")", options) + " of " + shape_of(tensor), options);
  std::vector<at::Tensor> tensors{on_group_device(group, tensor)};
  c10d::AllreduceOptions ao;
  ao.reduceOp = c10d_op(op);
  ao.timeout = timeout_of(group, options);
  wait_for(group, group.backend()->allreduce(tensors, ao), "all_reduce(" + to_string(op) + ")", options);
  if (!tensors[0].is_same(tensor)) tensor.copy_(tensors[0]);
  if (op == ReduceOp::mean) tensor.div_(group.world_size());
  return tensor;
}

std::vector<at::Tensor> all_gather(ProcessGroup& group, const at::Tensor& tensor, const CollectiveOptions& options) {
  check_same_call(group, call_name("all_gather", options) + " of " + shape_of(tensor, true), options);
  const int n = group.world_size();
  auto input = on_group_device(group, tensor.dim() == 0 ? tensor.reshape({1}) : tensor.contiguous());
  c10d::AllgatherOptions go;
  go.timeout = timeout_of(group, options);
  // One small exchange first: dtype, rank and trailing sizes must agree; the first dimension
  // may differ per rank.
  const auto header_of = [](const at::Tensor& t) {
    int64_t trailing_hash = 17;
    for (int64_t d = 1; d < t.dim(); ++d) trailing_hash = trailing_hash * 1000003 + t.size(d);
    return std::vector<int64_t>{static_cast<int64_t>(t.scalar_type()), t.dim(), trailing_hash, t.size(0)};
  };
  auto header = on_group_device(group, torch::tensor(header_of(input), torch::kInt64));
  std::vector<std::vector<at::Tensor>> headers(1);
  for (int r = 0; r < n; ++r) headers[0].push_back(output_buffer_like(header));
  std::vector<at::Tensor> header_in{header};
  wait_for(group, group.backend()->allgather(headers, header_in, go), "all_gather", options);
  std::vector<int64_t> rows(n);
  for (int r = 0; r < n; ++r) {
    if (!headers[0][r].slice(0, 0, 3).equal(header.slice(0, 0, 3))) {
      throw DistributedError(group.describe() + ": " + call_name("all_gather", options) + ": rank " +
                             std::to_string(r) + " passed a tensor whose dtype or sizes beyond the first "
                             "dimension differ from this rank's (" + c10::toString(input.scalar_type()) +
                             " " + c10::str(input.sizes()) + "); only the first dimension may differ.");
    }
    rows[r] = headers[0][r][3].item<int64_t>();
  }
  const int64_t longest = *std::max_element(rows.begin(), rows.end());
  // Gloo divides by the byte count: when every rank's tensor is empty there is nothing to send.
  if (input.numel() == 0 && longest == 0) return std::vector<at::Tensor>(n, tensor.clone());
  // Equal shapes gather straight from the input; uneven ones are padded to the longest first.
  at::Tensor send = input;
  if (input.size(0) != longest) {
    auto padded_shape = input.sizes().vec();
    padded_shape[0] = longest;
    send = torch::empty(padded_shape, input.options());
    send.slice(0, 0, input.size(0)).copy_(input);
  }
  std::vector<std::vector<at::Tensor>> out(1);
  for (int r = 0; r < n; ++r) out[0].push_back(output_buffer_like(send));
  std::vector<at::Tensor> in{send};
  wait_for(group, group.backend()->allgather(out, in, go), "all_gather", options);
  std::vector<at::Tensor> parts;
  for (int r = 0; r < n; ++r) {
    auto part = (rows[r] == longest ? out[0][r] : out[0][r].slice(0, 0, rows[r])).to(tensor.device());
    parts.push_back(tensor.dim() == 0 ? part.reshape({}) : part);
  }
  return parts;
}

at::Tensor all_gather_stacked(ProcessGroup& group, const at::Tensor& tensor, const CollectiveOptions& options) {
  auto parts = all_gather(group, tensor, options);
  for (size_t r = 0; r < parts.size(); ++r) {
    if (parts[r].sizes() != tensor.sizes()) {
      throw DistributedError(group.describe() + ": all_gather_stacked needs equal shapes, but rank " +
                             std::to_string(r) + " has " + c10::str(parts[r].sizes()) + " and this rank " +
                             c10::str(tensor.sizes()) + ". Use all_gather for uneven tensors.");
    }
  }
  return torch::stack(parts);
}

at::Tensor reduce_scatter(ProcessGroup& group, const at::Tensor& flat, ReduceOp op, const CollectiveOptions& options) {
  const std::string name = "reduce_scatter(" + to_string(op) + ")";
  if (op != ReduceOp::sum && op != ReduceOp::mean) {
    throw UsageError(group.describe() + ": " + name + ": reduce_scatter takes ReduceOp::sum or ReduceOp::mean; "
                     "for " + to_string(op) + ", use all_reduce and keep your part.");
  }
  if (op == ReduceOp::mean && !at::isFloatingType(flat.scalar_type())) {
    throw UsageError(group.describe() + ": " + name + " of a " + std::string(c10::toString(flat.scalar_type())) +
                     " tensor: convert it to float first, or use ReduceOp::sum.");
  }
  if (!flat.is_contiguous()) {
    throw UsageError(group.describe() + ": " + name + " needs a contiguous tensor; call .contiguous() first.");
  }
  check_same_call(group, call_name(name, options) + " of " + shape_of(flat), options);
  const int world = group.world_size();
  const int64_t numel = flat.numel();
  const int64_t part = std::max<int64_t>(1, (numel + world - 1) / world);
  // Equal parts for the transport: padded with zeros when they do not divide.
  auto padded = flat.reshape({-1});
  if (numel != part * world) {
    padded = torch::zeros({part * world}, flat.options());
    padded.narrow(0, 0, numel).copy_(flat.reshape({-1}));
  }
  auto shard = torch::empty({part}, flat.options());
  detail::reduce_scatter_equal_shards(group, padded, shard, op == ReduceOp::mean ? world : 1.0, name, options);
  const int64_t begin = std::min(numel, group.rank() * part);
  return shard.narrow(0, 0, std::min(numel, begin + part) - begin);
}

at::Tensor all_gather_into(ProcessGroup& group, const at::Tensor& shard, at::Tensor flat,
                           const CollectiveOptions& options) {
  const int world = group.world_size();
  const int64_t numel = flat.numel();
  const int64_t part = std::max<int64_t>(1, (numel + world - 1) / world);
  const int64_t begin = std::min(numel, group.rank() * part);
  const int64_t mine = std::min(numel, begin + part) - begin;
  std::string problem;
  if (!flat.is_contiguous()) problem = "flat must be contiguous; call .contiguous() first";
  if (shard.scalar_type() != flat.scalar_type()) {
    problem = "shard is " + std::string(c10::toString(shard.scalar_type())) + " but flat " +
              c10::toString(flat.scalar_type()) + "; give both one dtype";
  }
  if (shard.numel() != mine) {
    problem = "this rank's part of " + std::to_string(numel) + " elements over " + std::to_string(world) +
              " ranks has " + std::to_string(mine) + " (parts of " + std::to_string(part) +
              ", the last ranks' shorter), but its shard has " + std::to_string(shard.numel()) +
              "; pass the part reduce_scatter returned on this rank";
  }
  if (!problem.empty()) throw UsageError(group.describe() + ": all_gather_into: " + problem + ".");
  check_same_call(group, call_name("all_gather_into", options) + " of " + shape_of(flat), options);
  auto send = shard.reshape({-1});
  if (mine != part) {
    send = torch::zeros({part}, shard.options());
    send.narrow(0, 0, mine).copy_(shard.reshape({-1}));
  }
  auto whole = flat.view({-1});
  auto gathered = numel == part * world ? whole : torch::empty({part * world}, flat.options());
  detail::all_gather_equal_shards(group, send.contiguous(), gathered, "all_gather_into", options);
  if (!gathered.is_same(whole)) whole.copy_(gathered.narrow(0, 0, numel));
  return flat;
}

at::Tensor broadcast_tensor(ProcessGroup& group, at::Tensor tensor, int src, const CollectiveOptions& options) {
  check_source(group, src);
  check_same_call(group, call_name("broadcast", options) + " of " + shape_of(tensor) + " from rank " + std::to_string(src), options);
  return broadcast_unchecked(group, tensor, src, options);
}

c10::IValue broadcast(ProcessGroup& group, const c10::IValue& value, int src, const CollectiveOptions& options) {
  check_source(group, src);
  check_same_call(group, call_name("broadcast", options) + " of an object from rank " + std::to_string(src), options);
  std::string bytes;
  if (group.rank() == src) {
    const auto pickled = torch::pickle_save(value);
    bytes.assign(pickled.begin(), pickled.end());
  }
  bytes = broadcast_bytes(group, std::move(bytes), src, options);
  return torch::pickle_load(std::vector<char>(bytes.begin(), bytes.end()));
}

nlohmann::json broadcast_json(ProcessGroup& group, const nlohmann::json& value, int src,
                              const CollectiveOptions& options) {
  check_source(group, src);
  check_same_call(group, call_name("broadcast", options) + " of JSON from rank " + std::to_string(src), options);
  const std::string text = group.rank() == src ? value.dump() : std::string();
  return nlohmann::json::parse(broadcast_bytes(group, text, src, options));
}

void barrier(ProcessGroup& group, const std::string& name, const CollectiveOptions& options) {
  check_same_call(group, "barrier('" + name + "')", options);
  const int64_t generation = group.next_barrier_generation(name);
  const std::string prefix = "barrier/" + name + "/" + std::to_string(generation) + "/";
  auto& store = *group.store();
  store.set(prefix + std::to_string(group.rank()), std::vector<uint8_t>{1});
  std::vector<std::string> keys;
  for (int r = 0; r < group.world_size(); ++r) keys.push_back(prefix + std::to_string(r));
  const auto ranks_that = [&](bool arrived) {
    const auto lists = arrivals(store, prefix, group.world_size());
    const std::string& ranks = arrived ? lists.arrived : lists.missing;
    return ranks.empty() ? std::string("?") : ranks;
  };
  const std::string what = "barrier '" + name + "' (#" + std::to_string(generation) + ")";
  const auto timeout = timeout_of(group, options);
  // A quarter of the timeout in, a line says who is missing, long before the timeout ends the job.
  const auto warn_after = std::max(timeout / 4, std::chrono::milliseconds(1));
  const auto started = std::chrono::steady_clock::now();
  try {
    store.wait(keys, warn_after);
    return;
  } catch (const std::exception&) {
    if (std::chrono::steady_clock::now() - started >= warn_after * 9 / 10) {
      std::cerr << "lockstep: " + group.describe() + ": still waiting in " + what + " after " + seconds(warn_after) +
                       ": rank(s) " + ranks_that(false) + " have not arrived (rank(s) " + ranks_that(true) +
                       " have); it fails in " + seconds(timeout - warn_after) + ".\n";
    }
  }
  try {
    store.wait(keys, std::max(timeout - warn_after, std::chrono::milliseconds(1)));
  } catch (const std::exception& e) {
    throw DistributedError(group.describe() + ": " + what + " timed out after " + seconds(timeout) + "; rank(s) " +
                           ranks_that(false) + " did not arrive. They may have failed, be stuck, or be waiting at a "
                           "different barrier; check their output.");
  }
}

bool reduce_boolean_decision(ProcessGroup& group, bool decision, Decision rule, const CollectiveOptions& options) {
  auto votes = torch::tensor({decision ? 1.0f : 0.0f});
  all_reduce(group, votes, ReduceOp::sum, CollectiveOptions(options).tag(
      options.tag().empty() ? "reduce_boolean_decision" : options.tag()));
  const float yes = votes.item<float>();
  return rule == Decision::all ? yes >= static_cast<float>(group.world_size()) : yes > 0.0f;
}

}  // namespace distributed
}  // namespace lockstep
