// FSDPStrategy with StateDictType::dcp against PyTorch's FSDP2 and torch.distributed.checkpoint
// (gloo, CPU): a checkpoint FSDP2 saved on 4 ranks resumes in Lockstep on 2 as PyTorch's own
// 2-rank resume does, and one Lockstep saved on 2 ranks loads in Python on 3, bit for bit. The
// Python peer is DCP's (support/dcp_python.h); the tests skip, naming it, where it is absent.
#include <lockstep/strategies/fsdp_strategy.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <lockstep/checkpoint/checkpoint_io.h>
#include <lockstep/checkpoint/dcp_checkpoint.h>
#include <lockstep/core/error.h>
#include <lockstep/launchers/worker_environment.h>

#include "../../support/dcp_python.h"
#include "../../support/plan_ranks.h"
#include "../../support/temp_dir.h"

namespace lockstep {
namespace fsdp_dcp_test {

using strategies::FSDPStrategy;
using strategies::StateDictType;

// The model, the inputs and the steps, the same in Python and in C++.
const char* const kPythonCommon = R"(
import os, sys, torch, torch.distributed as dist, torch.multiprocessing as mp
import torch.distributed.checkpoint as dcp
from torch.distributed.fsdp import fully_shard
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict, get_model_state_dict, StateDictOptions

def net():
    torch.manual_seed(5)
    m = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.ReLU(), torch.nn.Linear(10, 3))
    for layer in m:
        if isinstance(layer, torch.nn.Linear): fully_shard(layer)
    fully_shard(m)
    return m

def batch(rank, step):
    return (torch.arange(24, dtype=torch.float32).reshape(4, 6) * 0.37 + rank * 1.3 + step * 0.11).sin()

def train(m, opt, rank, first, steps):
    for s in range(first, first + steps):
        m(batch(rank, s)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()

def group(world, port, fn, *args):
    def run(rank):
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
        fn(rank, *args)
        dist.destroy_process_group()
    mp.start_processes(run, nprocs=world, start_method="fork")
)";

const char* const kPythonSaveAndResume = R"(
def save(rank, path):
    m = net()
    opt = torch.optim.Adam(m.parameters(), lr=0.01)
    train(m, opt, rank, 0, 3)
    msd, osd = get_state_dict(m, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=path)

def resume(rank, path):
    m = net()
    opt = torch.optim.Adam(m.parameters(), lr=0.5)
    msd, osd = get_state_dict(m, opt)
    dcp.load({"model": msd, "optim": osd}, checkpoint_id=path)
    set_state_dict(m, opt, model_state_dict=msd, optim_state_dict=osd)
    train(m, opt, rank, 3, 20)
    full = get_model_state_dict(m, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        for k, v in full.items(): print(k, " ".join(float(x).hex() for x in v.flatten()))

path = sys.argv[1] + "/fsdp2.dcp"
group(4, int(sys.argv[2]), save, path)
group(2, int(sys.argv[2]) + 1, resume, path)
)";

const char* const kPythonLoadThree = R"(
def load(rank, path, out):
    m = net()
    opt = torch.optim.Adam(m.parameters(), lr=0.5)
    msd, osd = get_state_dict(m, opt)
    # Lockstep's Adam param_groups lack torch 2.x's decoupled_weight_decay: a partial load, and
    # every tensor is compared below.
    dcp.load({"model": msd, "optim": osd}, checkpoint_id=path, planner=DefaultLoadPlanner(allow_partial_load=True))
    whole = {"model." + k: v.full_tensor() for k, v in msd.items()}
    for fqn, state in osd["state"].items():
        for name, v in state.items():
            whole["optim." + fqn + "." + name] = v.full_tensor() if hasattr(v, "full_tensor") else v
    if rank == 0:
        torch.save(whole, out)
        print(osd["param_groups"][0]["lr"])

group(3, int(sys.argv[2]), load, sys.argv[1] + "/lockstep.dcp", sys.argv[1] + "/loaded.pt")
)";

torch::nn::Sequential model() {
  torch::manual_seed(5);
  return torch::nn::Sequential(torch::nn::Linear(6, 10), torch::nn::ReLU(), torch::nn::Linear(10, 3));
}

torch::Tensor batch(int rank, int step) {
  return (torch::arange(24, torch::kFloat32).reshape({4, 6}) * 0.37 + rank * 1.3 + step * 0.11).sin();
}

// Runs `body(strategy, net, wrapped module, Adam)` on 2 FSDP ranks (threads) that save in DCP's
// format, and returns rank 0's whole parameters at the end.
std::vector<std::pair<std::string, at::Tensor>> on_two_ranks(
    const std::function<void(FSDPStrategy&, torch::nn::Sequential&, strategies::WrappedModule&,
                             const std::shared_ptr<torch::optim::Adam>&)>& body) {
  std::vector<torch::nn::Sequential> nets{model(), model()};
  std::vector<std::pair<std::string, at::Tensor>> rank0;
  const auto options = PlanOptions().accelerator("cpu").devices("2").strategy("fsdp").timeout(60);
  testing::run_plan_ranks(2, options, [&](ExecutionPlan& plan) {
    auto& strategy = dynamic_cast<FSDPStrategy&>(*plan.strategy);
    auto& net = nets[strategy.global_rank()];
    auto wrapped = strategy.setup_module(net.ptr());
    body(strategy, net, *wrapped, std::make_shared<torch::optim::Adam>(net->parameters(), 0.01));
    auto whole = strategy.fsdp()->full_state_dict();
    if (strategy.global_rank() == 0) rank0 = whole;
  }, [] { return std::make_shared<FSDPStrategy>(distributed::ShardingOptions(), StateDictType::dcp); });
  return rank0;
}

testing::CommandResult run_python(const std::string& python, const std::string& script, const std::string& dir) {
  const std::string port = std::to_string(launchers::find_free_port());
  return testing::run_command({python, "-c", std::string(kPythonCommon) + script, dir, port},
                              {{"OMP_NUM_THREADS", "1"}, {"HOME", dir}}, std::chrono::seconds(400));
}

// The Trainer's checkpoint of `net` and `opt` (with an epoch), saved by the strategy at `path`.
void save(FSDPStrategy& strategy, torch::nn::Sequential& net, const std::shared_ptr<torch::optim::Adam>& opt,
          const std::string& path) {
  auto state = checkpoint::make_checkpoint();
  state.insert("state_dict", strategy.module_state_dict(*net));
  c10::impl::GenericList optimizers(c10::AnyType::get());
  optimizers.push_back(strategy.optimizer_state_dict(*opt));
  state.insert("optimizer_states", optimizers);
  state.insert("epoch", int64_t{1});
  strategy.save_checkpoint(state, path, checkpoint::CheckpointIO(), {opt});
}

// Python's printed "name hex hex ..." lines, by name.
std::map<std::string, std::vector<double>> printed(const std::string& out) {
  std::map<std::string, std::vector<double>> values;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream words(line);
    std::string name, word;
    words >> name;
    while (words >> word) values[name].push_back(std::strtod(word.c_str(), nullptr));
  }
  return values;
}

void train(torch::nn::Sequential& net, strategies::WrappedModule& wrapped, torch::optim::Optimizer& opt, int rank, int first,
           int steps) {
  for (int s = first; s < first + steps; ++s) {
    wrapped.before_forward();
    net->forward(batch(rank, s)).pow(2).mean().backward();
    opt.step();
    opt.zero_grad();
  }
}

// FSDP2 saves on 4 ranks after 3 steps; Lockstep resumes on 2 and its next 20 Adam steps give the
// parameters PyTorch's own 2-rank resume gives, to 1e-5.
TEST(FSDPStrategyDcp, Fsdp2CheckpointOfFourRanksResumesOnTwoAsPyTorchResumesIt) {
  LOCKSTEP_REQUIRE_DCP_PYTHON(python);
  testing::TempDir dir("lockstep_fsdp2_dcp");
  const auto pytorch = run_python(python, kPythonSaveAndResume, dir.path());
  ASSERT_EQ(pytorch.exit_code, 0) << pytorch.err;
  const auto expected = printed(pytorch.out);
  ASSERT_EQ(expected.size(), 4u) << pytorch.out;
  const std::string path = dir / "fsdp2.dcp";
  ASSERT_TRUE(checkpoint::is_dcp_checkpoint(path));

  const auto resumed = on_two_ranks([&](FSDPStrategy& strategy, torch::nn::Sequential& net,
                                        strategies::WrappedModule& wrapped, const std::shared_ptr<torch::optim::Adam>& opt) {
    opt->param_groups()[0].options().set_lr(0.5);  // the checkpoint's lr (0.01) must replace it
    const auto loaded = strategy.load_checkpoint(path, checkpoint::CheckpointIO(), {opt});
    strategy.load_module_state_dict(*net, loaded.at("state_dict").toGenericDict(), /*strict=*/true);
    strategy.load_optimizer_state_dict(*opt, loaded.at("optimizer_states").toListRef()[0].toGenericDict());
    train(net, wrapped, *opt, strategy.global_rank(), 3, 20);
  });
  ASSERT_EQ(resumed.size(), 4u);
  for (const auto& [name, tensor] : resumed) {
    const auto& want = expected.at(name);
    const auto got = tensor.flatten().to(torch::kFloat64);
    ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size())) << name;
    double worst = 0;
    for (int64_t i = 0; i < got.numel(); ++i) worst = std::max(worst, std::abs(got[i].item<double>() - want[i]));
    EXPECT_LE(worst, 1e-5) << name << ": largest difference from PyTorch's resume";
  }
}

// Lockstep saves on 2 ranks; Python's dcp.load on 3 FSDP2 ranks reads the parameters and Adam's
// state bit for bit.
TEST(FSDPStrategyDcp, TwoRanksCheckpointLoadsInPythonsDcpOnThreeBitForBit) {
  LOCKSTEP_REQUIRE_DCP_PYTHON(python);
  testing::TempDir dir("lockstep_dcp_to_python");
  const std::string path = dir / "lockstep.dcp";
  const auto saved = on_two_ranks([&](FSDPStrategy& strategy, torch::nn::Sequential& net,
                                     strategies::WrappedModule& wrapped, const std::shared_ptr<torch::optim::Adam>& opt) {
    train(net, wrapped, *opt, strategy.global_rank(), 0, 3);
    save(strategy, net, opt, path);
  });
  ASSERT_TRUE(checkpoint::is_dcp_checkpoint(path));

  const auto python_load = run_python(python, kPythonLoadThree, dir.path());
  ASSERT_EQ(python_load.exit_code, 0) << python_load.err;
  EXPECT_EQ(python_load.out, "0.01\n");
  const auto loaded = checkpoint::CheckpointIO().load(dir / "loaded.pt");
  for (const auto& [name, tensor] : saved) {
    EXPECT_TRUE(loaded.at("model." + name).toTensor().equal(tensor)) << name;
  }
  // Adam's state as Lockstep reads its own folder back, which Python must match exactly.
  const auto own = checkpoint::load_dcp(path);
  const std::vector<std::string> names{"0.weight", "0.bias", "2.weight", "2.bias"};
  for (size_t k = 0; k < names.size(); ++k) {
    for (const char* moment : {"exp_avg", "exp_avg_sq"}) {
      const auto& mine = own.tensors.at("optimizer_states/0/state/" + std::to_string(k) + "/" + moment);
      EXPECT_TRUE(loaded.at("optim." + names[k] + "." + moment).toTensor().equal(mine)) << names[k] << " " << moment;
    }
    EXPECT_EQ(loaded.at("optim." + names[k] + ".step").toTensor().item<double>(), 3.0) << names[k];
  }
}

// A run whose optimizer numbers the parameters otherwise than the saver's is refused, naming
// both, before any state is read into the wrong parameter.
TEST(FSDPStrategyDcp, AnOptimizerThatNumbersTheParametersOtherwiseIsRefused) {
  testing::TempDir dir("lockstep_dcp_other_order");
  const std::string path = dir / "lockstep.dcp";
  on_two_ranks([&](FSDPStrategy& strategy, torch::nn::Sequential& net, strategies::WrappedModule& wrapped,
                   const std::shared_ptr<torch::optim::Adam>& opt) {
    train(net, wrapped, *opt, strategy.global_rank(), 0, 1);
    save(strategy, net, opt, path);
  });
  std::vector<std::string> errors(2);
  on_two_ranks([&](FSDPStrategy& strategy, torch::nn::Sequential& net, strategies::WrappedModule&,
                   const std::shared_ptr<torch::optim::Adam>&) {
    auto params = net->parameters();
    std::reverse(params.begin(), params.end());
    const auto reversed = std::make_shared<torch::optim::Adam>(params, 0.01);
    try {
      strategy.load_checkpoint(path, checkpoint::CheckpointIO(), {reversed});
    } catch (const UsageError& e) {
      errors[strategy.global_rank()] = e.what();
    }
  });
  for (const auto& error : errors) {
    EXPECT_NE(error.find("parameter 0 is '0.weight' and this run's is '2.bias'"), std::string::npos) << error;
  }
}

}  // namespace fsdp_dcp_test
}  // namespace lockstep
