// Fabric in a real job, for tests/unit/fabric: every process writes what it saw into --out.
//   fabric_program [fabric flags] --out DIR --case collectives|train|gan|module_calls|api [--batch-size B]
//                  [--accumulate N] [--backward fabric|plain|twice|bypass] [--custom-ddp]
//                  [--save PATH] [--fail-on-rank R]
// collectives: ranks, all_reduce, all_gather, broadcast, barrier, print and log, as
// DIR/collectives.<rank>.json. train: one epoch of a small regression through setup,
// setup_dataloaders, backward and no_backward_sync (accumulating N batches per step); writes
// DIR/params.<rank>.pt, and DIR/accumulated.<rank>.pt: the gradients after the first batch that
// did not synchronise (none when N is 1). --backward says how: fabric.backward(loss) (fabric),
// loss.backward() (plain), a second loss.backward() through the same forward (twice), or a forward
// through the module itself, model->forward(x) (bypass). gan: a generator and a discriminator,
// each set up with its own optimizer, trained in alternation; DIR/params.<rank>.pt holds both.
// api: the calls beside the loop (collections and a subgroup in the collectives, all_gather with
// gradients, rank_zero_first, load_raw, non-strict load, save with a filter, init_module,
// callbacks, loaders from a torch::data dataset and without a sampler), as DIR/api.<rank>.json.
// module_calls: nested no_backward_sync guards and an evaluation on rank 0 alone with BatchNorm,
// as DIR/module_calls.<rank>.json. With --fail-on-rank R, rank R throws right after launch while
// the others wait at a barrier.
#include <fstream>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <lockstep/checkpoint/checkpoint_io.h>
#include <lockstep/checkpoint/state_dict.h>
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

void train(Fabric& fabric, const std::string& out, int64_t batch_size, int64_t accumulate, const std::string& save,
           const std::string& how) {
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
      auto prediction = how == "bypass" ? model->forward(batch.data) : model(batch.data);
      auto loss = torch::mse_loss(prediction, batch.target) / static_cast<double>(accumulate);
      if (how == "fabric") {
        fabric.backward(loss);
      } else if (how == "twice") {
        loss.backward({}, /*retain_graph=*/true);
        loss.backward();
      } else {
        loss.backward();
      }
    }
    if (!stepping && !recorded) {
      std::vector<torch::Tensor> grads;
      for (const auto& p : net->parameters()) grads.push_back(p.grad().clone());
      torch::save(grads, out + "/accumulated." + rank + ".pt");
      recorded = true;
    }
    if (!stepping) continue;
    optimizer->step();  // the handle's own call, through the precision
    optimizer->zero_grad();
  }
  if (!save.empty()) fabric.save(save, {{"state_dict", model}, {"optimizer", optimizer}, {"step", loader.num_batches()}});
  torch::save(net->parameters(), out + "/params." + rank + ".pt");
  if (auto* counting = dynamic_cast<CountingStrategy*>(&fabric.strategy())) {
    std::ofstream(out + "/configured." + rank) << counting->configured << "\n";
  }
}

struct Generator : torch::nn::Module {
  Generator() {
    fc1 = register_module("fc1", torch::nn::Linear(4, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 8));
  }
  torch::Tensor forward(const torch::Tensor& z) { return fc2(torch::tanh(fc1(z))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

struct Discriminator : torch::nn::Module {
  Discriminator() {
    fc1 = register_module("fc1", torch::nn::Linear(8, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 1));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

// Two modules, two optimizers, one Fabric: a discriminator step on real and generated samples,
// then a generator step through the discriminator. Each batch holds real samples (data) and the
// generator's noise (target), so 2 ranks on B examples each see what 1 process sees on 2B.
void gan(Fabric& fabric, const std::string& out, int64_t batch_size, const std::string& how) {
  torch::manual_seed(5);
  auto g = std::make_shared<Generator>();
  auto d = std::make_shared<Discriminator>();
  auto [generator, opt_g] = fabric.setup(g, std::make_shared<torch::optim::Adam>(g->parameters(), 1e-2));
  auto [discriminator, opt_d] = fabric.setup(d, std::make_shared<torch::optim::Adam>(d->parameters(), 1e-2));
  auto draws = at::make_generator<at::CPUGeneratorImpl>(3);
  auto real = torch::randn({64, 8}, draws) * 0.5 + 1.0;
  auto data = std::make_shared<TensorDataset>(real, torch::randn({64, 4}, draws));
  auto loader = fabric.setup_dataloaders(std::make_shared<DataLoader>(data, DataLoaderOptions(batch_size)));
  auto backward = [&](const torch::Tensor& loss) {
    if (how == "fabric") {
      fabric.backward(loss);
    } else {
      loss.backward();
    }
  };
  for (int epoch = 0; epoch < 2; ++epoch) {
    for (int64_t i = 0; i < loader.num_batches(); ++i) {
      Batch batch = loader.batch(i);
      auto fake = generator(batch.target);
      auto d_loss = torch::softplus(-discriminator(batch.data)).mean() + torch::softplus(discriminator(fake.detach())).mean();
      opt_d->zero_grad();
      backward(d_loss);
      opt_d->step();
      auto g_loss = torch::softplus(-discriminator(generator(batch.target))).mean();
      opt_g->zero_grad();
      backward(g_loss);
      opt_g->step();
    }
  }
  auto params = g->parameters();
  for (const auto& p : d->parameters()) params.push_back(p);
  torch::save(params, out + "/params." + std::to_string(fabric.global_rank()) + ".pt");
}

// Nested no_backward_sync guards restore what they found; rank 0 evaluates a BatchNorm model
// alone, under NoGradGuard, after a first step, while rank 1 waits at a barrier.
void module_calls(Fabric& fabric, const std::string& out) {
  torch::manual_seed(2);
  torch::nn::Sequential net(torch::nn::Linear(8, 6), torch::nn::BatchNorm1d(6), torch::nn::Linear(6, 1));
  auto [model, optimizer] = fabric.setup(net, std::make_shared<torch::optim::SGD>(net->parameters(), 0.1));
  nlohmann::json j;
  {
    auto outer = fabric.no_backward_sync(model);
    j["sync_in_outer"] = model.wrapped().gradient_sync();
    {
      auto inner = fabric.no_backward_sync(model);
      j["sync_in_inner"] = model.wrapped().gradient_sync();
    }
    j["sync_after_inner"] = model.wrapped().gradient_sync();
    {
      auto inert = fabric.no_backward_sync(model, false);
      j["sync_in_disabled"] = model.wrapped().gradient_sync();
    }
  }
  j["sync_after_outer"] = model.wrapped().gradient_sync();
  const auto x = torch::randn({4, 8}) * (fabric.global_rank() + 1);
  fabric.backward(model(x).pow(2).mean());
  optimizer->step();
  if (fabric.global_rank() == 0) {
    net->eval();
    torch::NoGradGuard no_grad;
    j["evaluated"] = model(torch::randn({3, 8})).size(0);
    net->train();
  }
  fabric.barrier("evaluated");
  optimizer->zero_grad();
  fabric.backward(model(x).pow(2).mean());
  optimizer->step();
  j["first_weight_sum"] = net->parameters()[0].sum().item<double>();
  std::ofstream(out + "/module_calls." + std::to_string(fabric.global_rank()) + ".json") << j.dump();
}

// A LibTorch torch::data dataset of 64 examples: x = [i, -i], y = i.
struct Counting : torch::data::datasets::Dataset<Counting> {
  torch::data::Example<> get(size_t i) override {
    const auto v = static_cast<float>(i);
    return {torch::tensor({v, -v}), torch::tensor(v)};
  }
  c10::optional<size_t> size() const override { return 64; }
};

struct Recorder : FabricCallback {
  Recorder() {
    on("on_epoch_end", [this](const std::vector<c10::IValue>& args) { calls.push_back(args.at(0).toInt()); });
  }
  std::vector<int64_t> calls;
};

void api(Fabric& fabric, const std::string& out) {
  const int r = fabric.global_rank();
  nlohmann::json j;
  using distributed::ReduceOp;
  // Collections, and a subgroup of rank 1 alone next to the whole job.
  const auto reduced = fabric.all_reduce(std::map<std::string, torch::Tensor>{
      {"a", torch::tensor({1.0 + r})}, {"b", torch::tensor({10.0 * r})}}, ReduceOp::sum);
  j["reduced_a"] = reduced.at("a").item<double>();
  j["reduced_b"] = reduced.at("b").item<double>();
  const auto gathered = fabric.all_gather(std::vector<torch::Tensor>{torch::tensor({r}), torch::tensor({r, r})});
  j["gathered_shapes"] = {gathered[0].sizes().vec(), gathered[1].sizes().vec()};
  j["gathered"] = values(gathered[0]);
  j["broadcast"] = values(fabric.broadcast(std::vector<torch::Tensor>{torch::full({2}, 5.0 + r)}, 1)[0]);
  auto everyone = fabric.new_group({0, 1});
  auto alone = fabric.new_group({1});
  j["subgroup_member"] = alone != nullptr;
  j["group_sum"] = fabric.all_reduce(torch::tensor({2.0 + r}), ReduceOp::sum, everyone.get()).item<double>();
  if (alone) j["alone_sum"] = fabric.all_reduce(torch::tensor({2.0 + r}), ReduceOp::sum, alone.get()).item<double>();
  // all_gather with gradients: rank r's input gets the sum over ranks of its slice's gradient.
  auto mine = torch::full({2}, 1.0 + r, torch::requires_grad());
  const auto weights = torch::tensor({{1.0f, 2.0f}, {3.0f, 4.0f}});
  (fabric.all_gather(mine, nullptr, /*sync_grads=*/true) * weights).sum().backward();
  j["gather_grad"] = values(mine.grad());
  // rank_zero_first: rank 0 writes the file the others then read.
  const std::string shared = out + "/prepared.txt";
  j["first"] = fabric.rank_zero_first([&] {
    if (r == 0) std::ofstream(shared) << "prepared by rank 0\n";
    std::ifstream in(shared);
    std::string line;
    std::getline(in, line);
    return line;
  });
  // init_module: built in the precision's dtype, on the device.
  auto net = fabric.init_module([] { return std::make_shared<RegressionNet>(); });
  j["init_device"] = net->parameters()[0].device().str();
  j["init_dtype"] = std::string(c10::toString(net->parameters()[0].scalar_type()));
  // save with a filter; load non-strict, load whole, load_raw.
  auto model = fabric.setup_module(net);
  const std::string ckpt = out + "/api.ckpt";
  fabric.save(ckpt, {{"model", model}, {"step", int64_t{3}}},
              {{"model", [](const std::string& name, const torch::Tensor&) { return name.rfind("fc1.", 0) == 0; }}});
  const auto whole = fabric.load(ckpt);
  std::vector<std::string> kept;
  for (const auto& item : whole.at("model").toGenericDict()) kept.push_back(item.key().toStringRef());
  j["filtered_keys"] = kept;
  auto fresh = std::make_shared<RegressionNet>();
  FabricState state{{"model", fresh}, {"not_saved", int64_t{-1}}};
  try {
    fabric.load(ckpt, state);
  } catch (const UsageError& e) {
    j["strict_error"] = std::string(e.what()).find("not_saved") != std::string::npos;
  }
  fabric.load(ckpt, state, /*strict=*/false);
  j["non_strict_fc1_equal"] = fresh->fc1->weight.equal(net->fc1->weight);
  j["non_strict_left_value"] = state.at("not_saved").value().toInt();
  const std::string raw = out + "/raw.pt";
  if (r == 0) checkpoint::CheckpointIO().save(checkpoint::state_dict(*net), raw);
  fabric.barrier("raw_written");
  auto copy = std::make_shared<RegressionNet>();
  fabric.load_raw(raw, copy);
  j["raw_equal"] = copy->fc2->weight.equal(net->fc2->weight) && copy->fc1->bias.equal(net->fc1->bias);
  // Callbacks by hook name.
  auto recorder = std::make_shared<Recorder>();
  fabric.add_callback(recorder);
  fabric.call("on_epoch_end", {int64_t{7}});
  fabric.call("a_hook_nobody_has", {});
  j["callback_calls"] = recorder->calls;
  // Loaders: a torch::data dataset split over the ranks, and one left whole.
  j["torch_data_batches"] = fabric.setup_dataloaders(Counting(), DataLoaderOptions(8)).num_batches();
  j["whole_batches"] = fabric.setup_dataloaders(std::make_shared<DataLoader>(testing::regression_data(64),
                                                                               DataLoaderOptions(8)),
                                                /*use_distributed_sampler=*/false).num_batches();
  const auto nested = fabric.to_device(std::map<std::string, std::vector<torch::Tensor>>{{"x", {torch::ones({2})}}});
  j["to_device"] = nested.at("x").at(0).device().str();
  j["accelerator"] = to_string(fabric.accelerator());
  std::ofstream(out + "/api." + std::to_string(r) + ".json") << j.dump();
}

}  // namespace

int main(int argc, char** argv) {
  return cli::guarded_main("fabric_program", [&] {
    CLI::App app{"Fabric test program", "fabric_program"};
    FabricOptions options;
    int64_t seed = -1, batch_size = 8, accumulate = 1;
    std::string out, which, save, how = "fabric";
    bool custom_ddp = false;
    int fail_on_rank = -1;
    cli::add_fabric_flags(app, options, seed);
    app.add_option("--out", out)->required();
    app.add_option("--case", which)->required()->check(CLI::IsMember({"collectives", "train", "gan", "module_calls", "api"}));
    app.add_option("--backward", how)->check(CLI::IsMember({"fabric", "plain", "twice", "bypass"}));
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
      } else if (which == "gan") {
        gan(f, out, batch_size, how);
      } else if (which == "api") {
        api(f, out);
      } else if (which == "module_calls") {
        module_calls(f, out);
      } else {
        train(f, out, batch_size, accumulate, save, how);
      }
      return 0;
    });
  });
}
