#include <lockstep/distributed/module_state.h>

#include <cstring>
#include <numeric>
#include <sstream>

#include <torch/torch.h>

#include <lockstep/distributed/bucket_assignment.h>
#include <lockstep/distributed/collectives.h>
#include <lockstep/core/error.h>

namespace lockstep {
namespace distributed {
namespace {

// One line per parameter, "name dtype [sizes] grad|nograd": what every rank must agree on.
std::string describe_parameter(const std::string& name, const at::Tensor& p) {
  std::ostringstream out;
  out << name << ' ' << c10::toString(p.scalar_type()) << ' ' << p.sizes() << (p.requires_grad() ? "" : " (no grad)");
  return out.str();
}

std::vector<std::string> split_lines(const at::Tensor& bytes) {
  const std::string text(reinterpret_cast<const char*>(bytes.data_ptr()), static_cast<size_t>(bytes.numel()));
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// The most bytes packed into one broadcast: a whole-model buffer would double the model's memory
// while it is wrapped.
constexpr int64_t kBroadcastBucketBytes = 16 << 20;

std::string parameter_at(const std::vector<std::string>& lines, size_t k) {
  return k < lines.size() ? "'" + lines[k] + "'" : "no parameter";
}

}  // namespace

void verify_same_parameters(torch::nn::Module& module, ProcessGroup& group, const std::string& wrapper) {
  std::string mine;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    mine += describe_parameter(item.key(), item.value()) + "\n";
  }
  auto bytes = torch::empty({static_cast<int64_t>(mine.size())}, torch::kUInt8);
  std::memcpy(bytes.data_ptr(), mine.data(), mine.size());
  const auto gathered = all_gather(group, bytes, CollectiveOptions().tag(wrapper + " parameter check"));
  std::vector<std::vector<std::string>> ranks;
  for (const auto& part : gathered) ranks.push_back(split_lines(part));
  // The first parameter position where some rank differs from rank 0.
  size_t first = SIZE_MAX;
  int other = -1;
  for (size_t r = 1; r < ranks.size(); ++r) {
    const size_t n = std::max(ranks[0].size(), ranks[r].size());
    for (size_t k = 0; k < n && k < first; ++k) {
      if (k >= ranks[0].size() || k >= ranks[r].size() || ranks[0][k] != ranks[r][k]) {
        first = k;
        other = static_cast<int>(r);
      }
    }
  }
  if (other < 0) return;
  std::string differing;
  for (size_t r = 1; r < ranks.size(); ++r) {
    if (ranks[r] != ranks[0]) differing += (differing.empty() ? "" : ", ") + std::to_string(r);
  }
  std::ostringstream msg;
  msg << group.describe() << ": " << wrapper << " needs the same parameters on every rank, but rank(s) "
      << differing << " differ from rank 0. First difference, parameter #" << first << ": rank 0 has "
      << parameter_at(ranks[0], first) << ", rank " << other << " has " << parameter_at(ranks[other], first)
      << " (rank 0 has " << ranks[0].size() << " parameters, rank " << other << " has " << ranks[other].size()
      << "). Build the same model (same layers, sizes and dtypes) on every rank before wrapping it.";
  throw DistributedError(msg.str());
}

void broadcast_tensors(ProcessGroup& group, const std::vector<at::Tensor>& tensors, const std::string& what, int src) {
  if (tensors.empty() || group.world_size() == 1) return;
  torch::NoGradGuard no_grad;
  const auto options = CollectiveOptions().tag(what + " from rank " + std::to_string(src));
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), 0);
  for (const auto& bucket : assign_buckets(tensors, order, kBroadcastBucketBytes, kBroadcastBucketBytes)) {
    if (bucket.size() == 1 && tensors[bucket[0]].is_contiguous()) {  // goes as it is
      auto alone = tensors[bucket[0]];
      broadcast_tensor(group, alone, src, options);
      continue;
    }
    std::vector<at::Tensor> flat;
    for (size_t i : bucket) flat.push_back(tensors[i].reshape({-1}));
    auto packed = torch::cat(flat);
    broadcast_tensor(group, packed, src, options);
    int64_t offset = 0;
    for (size_t i : bucket) {
      tensors[i].copy_(packed.narrow(0, offset, tensors[i].numel()).view(tensors[i].sizes()));
      offset += tensors[i].numel();
    }
  }
}

}  // namespace distributed
}  // namespace lockstep
