// Fabric in a real job, for tests/unit/fabric: every process writes what it saw into --out.
//   fabric_program [fabric flags] --out DIR --case collectives|train [--batch-size B]
//                  [--accumulate N] [--custom-ddp] [--save PATH] [--fail-on-rank R]
// collectives: ranks, all_reduce, all_gather, broadcast, barrier, print and log, as
// DIR/collectives.<rank>.json. train: one epoch of a small regression through setup,
// setup_dataloaders, backward and no_backward_sync (accumulating N batches per step); writes
// DIR/params.<rank>.pt, and DIR/accumulated.<rank>.pt: the gradients after the first batch that
// did not synchronise (none when N is 1). With --fail-on-rank R, rank R throws right after launch
// while the others wait at a barrier.
#include <fstream>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <lockstep/cli/guarded_main.h>
#include <lockstep/cli/trainer_flags.h>
#include <lockstep/fabric/fabric.h>
#include <lockstep/loggers/csv_logger.h>
#include <lockstep/strategies/ddp_strategy.h>

#include "../support/regression.h"

namespace {

using namespace lockstep;

struct RegressionNet : torch::nn::Module {
  RegressionNet() {
    fc1 = register_module("fc1", torch::nn::Linear(8, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 1));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

// A custom configure_ddp: DDP as usual, counted.
struct CountingStrategy : strategies::DDPStrategy {
  std::shared_ptr<distributed::DistributedDataParallelBase> configure_ddp(
      const std::shared_ptr<torch::nn::Module>& module, const std::vector<int>& device_ids) override {
    ++configured;
    return DDPStrategy::configure_ddp(module, device_ids);
  }
  int configured = 0;
};

std::vector<double> values(const torch::Tensor& t) {
  auto flat = t.to(torch::kFloat64).contiguous().view(-1);
  return std::vector<double>(flat.data_ptr<double>(), flat.data_ptr<double>() + flat.numel());
}

void collectives(Fabric& fabric, const std::string& out) {
  const int r = fabric.global_rank();
  fabric.add_logger(std::make_shared<loggers::CSVLogger>(loggers::LoggerOptions(out + "/logs").version(0)));
  const auto mine = torch::tensor({1.0 + r, 2.0 * (1 + r)});
  nlohmann::json j{{"global_rank", r},
                   {"local_rank", fabric.local_rank()},
                   {"node_rank", fabric.node_rank()},
                   {"world_size", fabric.world_size()},
                   {"is_global_zero", fabric.is_global_zero()},
                   {"device", fabric.device().str()}};
  using distributed::ReduceOp;
  for (const auto& [name, op] : {std::pair{"mean", ReduceOp::mean}, {"sum", ReduceOp::sum}, {"max", ReduceOp::max},
                                 {"min", ReduceOp::min}}) {
    j["all_reduce"][name] = values(fabric.all_reduce(mine, op));
  }
  j["input_after_all_reduce"] = values(mine);
  j["all_reduce_double_sum"] = fabric.all_reduce(0.5 + r, ReduceOp::sum);
  const auto gathered = fabric.all_gather(torch::tensor({r, 10 * r}));
  j["all_gather_shape"] = gathered.sizes().vec();
  j["all_gather"] = values(gathered);
  const int src = fabric.world_size() - 1;
  j["broadcast_tensor"] = values(fabric.broadcast(torch::full({3}, 100.0 + r), src));
  j["broadcast_string"] = fabric.broadcast(c10::IValue("written by rank " + std::to_string(r)), 0).toStringRef();
  fabric.barrier("collectives_done");
  fabric.print("printed by rank ", r);
  fabric.log("rank_sum", fabric.all_reduce(static_cast<double>(r), ReduceOp::sum), 3);
  fabric.log_dict({{"a", 1.5 + r}, {"b", 2.5}}, 4);
  std::ofstream(out + "/collectives." + std::to_string(r) + ".json") << j.dump();
}

void train(Fabric& fabric, const std::string& out, int64_t batch_size, int64_t accumulate, const std::string& save) {
  torch::manual_seed(11);
  auto net = std::make_shared<RegressionNet>();
  auto [model, optimizer] = fabric.setup(net, std::make_shared<torch::optim::SGD>(
                                                  net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9)));
  auto loader = fabric.setup_dataloaders(
      std::make_shared<DataLoader>(testing::regression_data(64), DataLoaderOptions(batch_size)));
  const std::string rank = std::to_string(fabric.global_rank());
  bool recorded = false;
  for (int64_t i = 0; i < loader.num_batches(); ++i) {
    Batch batch = loader.batch(i);
    const bool stepping = (i + 1) % accumulate == 0;
    {
      auto guard = fabric.no_backward_sync(model, !stepping);
      fabric.backward(torch::mse_loss(model(batch.data), batch.target) / static_cast<double>(accumulate));
    }
    if (!stepping && !recorded) {
      std::vector<torch::Tensor> grads;
      for (const auto& p : net->parameters()) grads.push_back(p.grad().clone());
      torch::save(grads, out + "/accumulated." + rank + ".pt");
      recorded = true;
    }
    if (!stepping) continue;
    optimizer.step();
    optimizer.zero_grad();
  }
  if (!save.empty()) fabric.save(save, {{"state_dict", model}, {"optimizer", optimizer}, {"step", loader.num_batches()}});
  torch::save(net->parameters(), out + "/params." + rank + ".pt");
  if (auto* counting = dynamic_cast<CountingStrategy*>(&fabric.strategy())) {
    std::ofstream(out + "/configured." + rank) << counting->configured << "\n";
  }
}

}  // namespace

int main(int argc, char** argv) {
  return cli::guarded_main("fabric_program", [&] {
    CLI::App app{"Fabric test program", "fabric_program"};
    FabricOptions options;
    int64_t seed = -1, batch_size = 8, accumulate = 1;
    std::string out, which, save;
    bool custom_ddp = false;
    int fail_on_rank = -1;
    cli::add_fabric_flags(app, options, seed);
    app.add_option("--out", out)->required();
    app.add_option("--case", which)->required()->check(CLI::IsMember({"collectives", "train"}));
    app.add_option("--batch-size", batch_size);
    app.add_option("--accumulate", accumulate);
    app.add_option("--save", save);
    app.add_flag("--custom-ddp", custom_ddp);
    app.add_option("--fail-on-rank", fail_on_rank);
    const int parsed = cli::parse_or_exit_code(app, argc, argv);
    if (parsed >= 0) return parsed;
    torch::set_num_threads(1);
    Fabric fabric(options);
    if (custom_ddp) fabric.set_strategy(std::make_shared<CountingStrategy>());
    return fabric.launch([&](Fabric& f) {
      if (f.global_rank() == fail_on_rank) throw std::runtime_error("rank " + std::to_string(fail_on_rank) + " fails on purpose");
      if (which == "collectives") {
        collectives(f, out);
      } else {
        train(f, out, batch_size, accumulate, save);
      }
      return 0;
    });
  });
}
