// Strategy::save_safetensors on 2 ranks run as threads: with an index path each rank writes the
// tensors it owns (runs of names in sorted order, about equal bytes) and rank 0 the index, under
// DDP and under FSDP (which gathers each tensor to its owner only, whatever its state_dict_type);
// the shards load as the whole model, in Lockstep and in Python's safetensors; a .safetensors
// path is one file from rank 0.
#include <lockstep/strategies/strategy.h>

#include <filesystem>
#include <iomanip>
#include <stdexcept>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <lockstep/checkpoint/safetensors.h>
#include <lockstep/strategies/fsdp_strategy.h>

#include "../../support/command.h"
#include "../../support/paths.h"
#include "../../support/plan_ranks.h"
#include "../../support/temp_dir.h"

namespace lockstep {
namespace save_safetensors_test {

using Tensors = c10::Dict<std::string, torch::Tensor>;

// 0.bias and 0.weight (1,120 bytes) fall to rank 0; 2.bias and 2.weight (492 bytes) to rank 1.
torch::nn::Sequential model() {
  torch::manual_seed(5);
  return torch::nn::Sequential(torch::nn::Linear(6, 40), torch::nn::ReLU(), torch::nn::Linear(40, 3));
}

std::set<std::string> names_of(const Tensors& tensors) {
  std::set<std::string> names;
  for (const auto& item : tensors) names.insert(item.key());
  return names;
}

std::string hex_of(const torch::Tensor& tensor) {
  const auto bytes = tensor.contiguous().view({-1}).view(torch::kUInt8);
  std::ostringstream out;
  for (int64_t i = 0; i < bytes.numel(); ++i) out << std::hex << std::setw(2) << std::setfill('0') << bytes[i].item<int>();
  return out.str();
}

// 2 ranks train one Adam step under `strategy`, take the whole state_dict (the reference), then
// save it at `path`; returns rank 0's reference.
Tensors save_on_two_ranks(const std::string& strategy, const std::vector<std::string>& paths,
                          const std::function<std::shared_ptr<strategies::Strategy>()>& make = nullptr) {
  std::vector<torch::nn::Sequential> nets{model(), model()};
  std::vector<Tensors> whole(2);
  const auto options = PlanOptions().accelerator("cpu").devices("2").strategy(strategy).timeout(20);
  testing::run_plan_ranks(2, options, [&](ExecutionPlan& plan) {
    auto& s = *plan.strategy;
    auto& net = nets[s.global_rank()];
    auto wrapped = s.setup_module(net.ptr());
    torch::optim::Adam opt(net->parameters(), 0.01);
    wrapped->before_forward();
    const auto out = net->forward(torch::full({4, 6}, s.global_rank() + 1.0));
    wrapped->after_forward({out}, /*known=*/true);
    s.backward(out.pow(2).sum());
    opt.step();
    auto* fsdp = dynamic_cast<strategies::FSDPStrategy*>(&s);
    if (fsdp != nullptr) {
      const auto type = fsdp->state_dict_type();
      fsdp->state_dict_type(strategies::StateDictType::full);
      whole[s.global_rank()] = s.module_state_dict(*net);
      fsdp->state_dict_type(type);
    } else {
      whole[s.global_rank()] = s.module_state_dict(*net);
    }
    for (const auto& path : paths) s.save_safetensors(*net, path);
  }, make);
  return whole[0];
}

void expect_identical(const Tensors& expected, const Tensors& got, const std::string& where) {
  ASSERT_EQ(names_of(expected), names_of(got)) << where;
  for (const auto& item : expected) {
    EXPECT_TRUE(torch::equal(item.value(), got.at(item.key()))) << where << ": " << item.key();
  }
}

void expect_one_shard_per_rank(const testing::TempDir& dir, const Tensors& whole) {
  const std::string index = dir / "model.safetensors.index.json";
  const auto first = checkpoint::load_safetensors(dir / "model-00001-of-00002.safetensors").tensors;
  const auto second = checkpoint::load_safetensors(dir / "model-00002-of-00002.safetensors").tensors;
  EXPECT_EQ(names_of(first), (std::set<std::string>{"0.bias", "0.weight"}));
  EXPECT_EQ(names_of(second), (std::set<std::string>{"2.bias", "2.weight"}));
  expect_identical(whole, checkpoint::load_safetensors(index).tensors, index);
}

TEST(SaveSafetensors, UnderDdpEachRankWritesTheShardItOwns) {
  testing::TempDir dir("lockstep_save_safetensors_ddp");
  const auto whole = save_on_two_ranks("ddp", {dir / "model.safetensors.index.json", dir / "model.safetensors"});
  expect_one_shard_per_rank(dir, whole);
  expect_identical(whole, checkpoint::load_safetensors(dir / "model.safetensors").tensors, "model.safetensors");
}

// Sharded state_dict_type: module_state_dict gives pieces, save_safetensors still whole tensors.
TEST(SaveSafetensors, UnderFsdpEachRankGathersOnlyWhatItOwns) {
  testing::TempDir dir("lockstep_save_safetensors_fsdp");
  const auto make = [] {
    return std::make_shared<strategies::FSDPStrategy>(distributed::ShardingOptions().auto_wrap_min_params(200),
                                                      strategies::StateDictType::sharded);
  };
  const auto whole = save_on_two_ranks("fsdp", {dir / "model.safetensors.index.json", dir / "model.safetensors"}, make);
  expect_one_shard_per_rank(dir, whole);
  expect_identical(whole, checkpoint::load_safetensors(dir / "model.safetensors").tensors, "model.safetensors");
}

// A rank whose write fails does not leave the others waiting: each rank ends the save at once,
// the failed one with its own error, and no index is written.
TEST(SaveSafetensors, ARankThatFailsToWriteEndsTheSaveOnEveryRank) {
  testing::TempDir dir("lockstep_save_safetensors_fails");
  std::vector<torch::nn::Sequential> nets{model(), model()};
  std::vector<std::string> errors(2);
  const auto options = PlanOptions().accelerator("cpu").devices("2").strategy("ddp").timeout(20);
  testing::run_plan_ranks(2, options, [&](ExecutionPlan& plan) {
    auto& s = *plan.strategy;
    const int rank = s.global_rank();
    s.setup_module(nets[rank].ptr());
    const auto refuse_on_rank_1 = [rank](const std::string&, const torch::Tensor&) -> bool {
      if (rank == 1) throw std::runtime_error("no room on rank 1");
      return true;
    };
    try {
      s.save_safetensors(*nets[rank], dir / "model.safetensors.index.json", refuse_on_rank_1);
    } catch (const std::exception& e) {
      errors[rank] = e.what();
    }
  });
  EXPECT_EQ(errors[1], "no room on rank 1");
  EXPECT_NE(errors[0].find("another rank failed to write its part"), std::string::npos) << errors[0];
  EXPECT_FALSE(std::filesystem::exists(dir / "model.safetensors.index.json"));
}

// Reads the index and its shards as transformers does and prints each tensor's bytes by name.
const char* const kPythonReader = R"(
import json, sys
d = sys.argv[1]
try:
    import torch
    from safetensors.torch import load_file
    def raw(t): return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
except ImportError:
    try:
        from safetensors.numpy import load_file
    except ImportError as e:
        print("skip", sys.executable, "has no safetensors package:", e)
        sys.exit(0)
    def raw(t): return t.tobytes()
index = json.load(open(d + "/model.safetensors.index.json"))
model = {}
for shard in sorted(set(index["weight_map"].values())):
    for name, t in load_file(d + "/" + shard).items():
        assert index["weight_map"][name] == shard, name
        model[name] = t
assert sorted(model) == sorted(index["weight_map"]), "the shards hold other names than the index"
assert index["metadata"]["total_size"] == sum(len(raw(t)) for t in model.values())
for name in sorted(model):
    print(name, raw(model[name]).hex())
)";

TEST(SaveSafetensors, PythonReadsAnFsdpRunsShardsAsOneModel) {
  testing::TempDir dir("lockstep_save_safetensors_python");
  const auto whole = save_on_two_ranks("fsdp", {dir / "model.safetensors.index.json"});
  const auto result = testing::run_command({LOCKSTEP_TEST_PYTHON, "-c", kPythonReader, dir.path()},
                                           {{"OMP_NUM_THREADS", "1"}, {"HOME", dir.path()}}, std::chrono::seconds(120));
  ASSERT_EQ(result.exit_code, 0) << result.out << result.err;
  std::map<std::string, std::string> python;
  for (const auto& line : result.out_lines()) {
    if (line.rfind("skip ", 0) == 0) GTEST_SKIP() << line.substr(5) << " (scripts/libtorch2-requirements.txt has it)";
    const auto space = line.find(' ');
    python[line.substr(0, space)] = space == std::string::npos ? "" : line.substr(space + 1);
  }
  ASSERT_EQ(python.size(), whole.size()) << result.out;
  for (const auto& item : whole) EXPECT_EQ(python[item.key()], hex_of(item.value())) << item.key();
}

}  // namespace save_safetensors_test
}  // namespace lockstep
