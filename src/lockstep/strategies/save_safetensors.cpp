// Strategy::save_safetensors: a module's weights as one safetensors file, or as one shard per rank
// that each rank writes itself.
#include <lockstep/strategies/strategy.h>

#include <exception>
#include <functional>
#include <map>

#include <lockstep/checkpoint/safetensors.h>
#include <lockstep/checkpoint/state_dict.h>
#include <lockstep/core/error.h>

namespace lockstep {
namespace strategies {
namespace {

const std::map<std::string, std::string> kPytorchFormat{{"format", "pt"}};

// Each name's rank: the names in sorted order cut into `ranks` runs of about equal bytes (a name
// goes to the rank in whose share of the total its first byte falls), so that the shards, in
// rank order, hold the names in order, as save_sharded_safetensors' do.
std::map<std::string, int> owners_by_bytes(const std::vector<std::pair<std::string, int64_t>>& sizes, int ranks) {
  const std::map<std::string, int64_t> sorted(sizes.begin(), sizes.end());
  int64_t total = 0;
  for (const auto& item : sorted) total += item.second;
  std::map<std::string, int> owner;
  int64_t before = 0;
  for (const auto& [name, bytes] : sorted) {
    owner[name] = total == 0 ? 0 : static_cast<int>(static_cast<double>(before) / static_cast<double>(total) * ranks);
    before += bytes;
  }
  return owner;
}

c10::Dict<std::string, torch::Tensor> kept(const c10::Dict<std::string, torch::Tensor>& tensors, const TensorFilter& keep) {
  if (!keep) return tensors;
  c10::Dict<std::string, torch::Tensor> out;
  for (const auto& item : tensors) {
    if (keep(item.key(), item.value())) out.insert(item.key(), item.value());
  }
  return out;
}

// Runs `write` on this rank and agrees with the others whether every rank's write succeeded, so
// that no rank waits at a barrier for one that failed: a rank whose write failed rethrows its
// error, the others one that names the save.
void on_every_rank(Strategy& strategy, const std::string& path, const std::function<void()>& write) {
  std::exception_ptr failure;
  try {
    write();
  } catch (...) {
    failure = std::current_exception();
  }
  if (strategy.reduce_boolean_decision(failure == nullptr)) return;
  if (failure) std::rethrow_exception(failure);
  throw Error(ErrorKind::io, "saving safetensors '" + path + "': another rank failed to write its part (its "
                                   "error names the cause); nothing here was wrong.");
}

}  // namespace

c10::Dict<std::string, torch::Tensor> Strategy::whole_tensors(const torch::nn::Module& module,
                                                              const std::function<bool(const std::string&)>& wanted) {
  c10::Dict<std::string, torch::Tensor> out;
  for (const auto& item : checkpoint::state_dict(module)) {
    if (wanted(item.key())) out.insert(item.key(), item.value());
  }
  return out;
}

std::vector<std::pair<std::string, int64_t>> Strategy::whole_sizes(const torch::nn::Module& module) {
  std::vector<std::pair<std::string, int64_t>> sizes;
  for (const auto& item : checkpoint::state_dict(module)) {
    sizes.emplace_back(item.key(), item.value().numel() * static_cast<int64_t>(item.value().element_size()));
  }
  return sizes;
}

void Strategy::save_safetensors(const torch::nn::Module& module, const std::string& path, const TensorFilter& keep) {
  const int rank = global_rank();
  if (world_size() == 1 || !checkpoint::is_safetensors_index_path(path)) {
    const auto mine = whole_tensors(module, [rank](const std::string&) { return rank == 0; });
    on_every_rank(*this, path, [&] {
      if (rank == 0) checkpoint::save_safetensors(kept(mine, keep), path, kPytorchFormat);
    });
    return;
  }
  const auto owner = owners_by_bytes(whole_sizes(module), world_size());
  std::map<int, std::size_t> number;  // the ranks that own a tensor, numbered from 1
  for (const auto& item : owner) number.emplace(item.second, 0);
  std::vector<std::string> shards;
  for (auto& [owning_rank, n] : number) {
    n = shards.size() + 1;
    shards.push_back(checkpoint::safetensors_shard_path(path, n, number.size()));
  }
  const auto mine = whole_tensors(module, [&](const std::string& name) { return owner.at(name) == rank; });
  on_every_rank(*this, path, [&] {
    if (number.count(rank)) checkpoint::save_safetensors(kept(mine, keep), shards[number.at(rank) - 1], kPytorchFormat);
  });
  on_every_rank(*this, path, [&] {
    if (rank == 0) checkpoint::write_safetensors_index(path, shards);
  });
}

}  // namespace strategies
}  // namespace lockstep
