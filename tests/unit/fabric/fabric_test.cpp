// Fabric on one process, in this test's own process: each method does what it says, checked
// against the same computation written without Fabric. The multi-process behaviour is in
// fabric_ddp_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include <torch/torch.h>

#include <lockstep/checkpoint/checkpoint_io.h>
#include <lockstep/cli/trainer_flags.h>
#include <lockstep/core/error.h>
#include <lockstep/environments/local_environment.h>
#include <lockstep/fabric/fabric.h>
#include <lockstep/loggers/csv_logger.h>
#include <lockstep/strategies/fsdp_strategy.h>

#include "../../support/command.h"
#include "../../support/heap_probe.h"
#include "../../support/paths.h"
#include "../../support/regression.h"
#include "../../support/scheduler_environment.h"
#include "../../support/temp_dir.h"
#include "../../support/written_parameters.h"

namespace lockstep {
namespace fabric_test {

// FabricOptions as a Fabric program's flags (cli::add_fabric_flags) set them from `line`.
FabricOptions fabric_flags(const std::string& line) {
  FabricOptions options;
  int64_t seed = -1;
  CLI::App app("prog");
  cli::add_fabric_flags(app, options, seed);
  app.parse(line, false);
  return options;
}

}  // namespace fabric_test

namespace {

struct Net : torch::nn::Module {
  Net() {
    fc1 = register_module("fc1", torch::nn::Linear(8, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 1));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

FabricOptions one_process() { return FabricOptions().devices("1").accelerator("cpu"); }

std::shared_ptr<Net> seeded_net() {
  torch::manual_seed(3);
  return std::make_shared<Net>();
}

std::shared_ptr<torch::optim::SGD> sgd(Net& net) {
  return std::make_shared<torch::optim::SGD>(net.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
}

using testing::max_diff;

std::vector<torch::Tensor> grads(Net& net) {
  std::vector<torch::Tensor> out;
  for (const auto& p : net.parameters()) out.push_back(p.grad().clone());
  return out;
}

TEST(Fabric, EveryCallBeforeLaunchNamesLaunch) {
  Fabric fabric(one_process());
  auto net = seeded_net();
  for (const auto& call : std::vector<std::function<void()>>{
           [&] { fabric.setup(net, sgd(*net)); }, [&] { fabric.global_rank(); }, [&] { fabric.barrier("x"); },
           [&] { fabric.backward(torch::ones({})); }, [&] { auto scope = fabric.autocast(); }}) {
    try {
      call();
      ADD_FAILURE() << "no error before launch()";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("Call fabric.launch() first"), std::string::npos) << e.what();
    }
  }
}

TEST(Fabric, LaunchResolvesTheTrainersOptionsOnce) {
  Fabric fabric(one_process());
  EXPECT_EQ(fabric.launch([](Fabric& f) { return f.world_size() * 10 + f.global_rank(); }), 10);
  EXPECT_EQ(fabric.strategy().name(), "single_device");
  EXPECT_EQ(fabric.local_rank(), 0);
  EXPECT_EQ(fabric.node_rank(), 0);
  EXPECT_TRUE(fabric.is_global_zero());
  EXPECT_EQ(fabric.device(), torch::Device(torch::kCPU));
  EXPECT_THROW(fabric.launch(), UsageError);
  EXPECT_THROW(fabric.set_strategy(std::make_shared<strategies::SingleDeviceStrategy>()), UsageError);
}

#ifdef __GLIBC__
// launch() tunes the heap for training (core/heap.h): a 24 MiB block comes from the heap afterwards.
TEST(Fabric, LaunchTunesTheHeapForTraining) {
  testing::small_mmap_threshold();
  ASSERT_FALSE(testing::heap_serves(24 << 20));
  Fabric fabric(one_process());
  fabric.launch();
  EXPECT_TRUE(testing::heap_serves(24 << 20));
}
#endif

// Lightning's Fabric(plugins=[MyClusterEnvironment()]): the job runs in the user's environment,
// here a scheduler's job of one process whose rank 0 listens on a port of its choosing.
TEST(Fabric, SetClusterEnvironmentReplacesTheDetectedOne) {
  const auto mine = testing::scheduler_environment(0, 1, 1, "127.0.0.1", environments::find_free_port());
  Fabric fabric(FabricOptions().accelerator("cpu").strategy("ddp"));
  EXPECT_THROW(fabric.set_cluster_environment(nullptr), UsageError);
  fabric.set_cluster_environment(mine);
  fabric.launch();
  EXPECT_EQ(fabric.strategy().context().environment, mine);
  EXPECT_EQ(fabric.strategy().context().devices_per_node, 1) << "auto: its one process per node";
  EXPECT_EQ(fabric.world_size(), 1);
  EXPECT_THROW(fabric.set_cluster_environment(mine), UsageError) << "after launch()";
}

TEST(Fabric, BadOptionsAreTheTrainersUsageErrors) {
  const std::vector<std::pair<FabricOptions, std::string>> cases = {
      {FabricOptions().strategy("deepspeed"), "Use --strategy ddp"},
      {fabric_test::fabric_flags("--strategy ddp --fsdp-sharding SHARD_GRAD_OP"), "Add --strategy fsdp"},
      {FabricOptions().strategy("nope"), "Use auto or one of"},
      {FabricOptions().devices("two"), "--devices 2"},
      {FabricOptions().precision("8"), "Use 32-true"},
      {FabricOptions().num_nodes(2), "lockstep launch --nnodes 2"},
      {FabricOptions().accelerator("cpu").precision("16-mixed"), "--precision bf16-mixed"},
  };
  for (const auto& [options, fix] : cases) {
    Fabric fabric(options);
    try {
      fabric.launch();
      ADD_FAILURE() << "no error; expected one naming " << fix;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(fix), std::string::npos) << e.what();
    }
  }
}

// Fabric::save gathers whole tensors: an FSDPStrategy that saves each rank's pieces (the Trainer's
// sharded or DCP checkpoints) is refused before any process starts.
TEST(Fabric, AStrategyThatSavesPiecesIsRefused) {
  for (const auto type : {strategies::StateDictType::sharded, strategies::StateDictType::dcp}) {
    Fabric fabric(one_process());
    fabric.set_strategy(std::make_shared<strategies::FSDPStrategy>(distributed::ShardingOptions(), type));
    try {
      fabric.launch();
      ADD_FAILURE() << "a state dict type of pieces was accepted";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("strategy fsdp saves each rank's pieces (FSDPStrategy with "
                                           "StateDictType::sharded or dcp, which are for the Trainer's "
                                           "checkpoints). Give it StateDictType::full."),
                std::string::npos) << e.what();
    }
  }
}

TEST(Fabric, SetupWrapsOneModuleAndBackwardGivesTheGradientsOfLossBackward) {
  auto plain = seeded_net();
  auto net = seeded_net();
  const auto data = testing::regression_data(16);
  const Batch batch = DataLoader(data, DataLoaderOptions(16)).batch(0);
  torch::mse_loss(plain->forward(batch.data), batch.target).backward();

  Fabric fabric(one_process());
  fabric.launch();
  auto [model, optimizer] = fabric.setup(net, sgd(*net));
  EXPECT_EQ(model.module(), net);
  fabric.backward(torch::mse_loss(model(batch.data), batch.target));
  EXPECT_EQ(max_diff(grads(*plain), grads(*net)), 0.0);
  EXPECT_TRUE(optimizer.step());
  EXPECT_GT(max_diff(plain->parameters(), net->parameters()), 1e-4) << "the step must move the parameters";
  optimizer.zero_grad();
}

// Several modules and optimizers: setup(module, opt1, opt2) binds them in order, setup_module
// and setup_optimizers apart; `optimizer->step()` steps the wrapped optimizer as step() does.
TEST(Fabric, SetupTakesSeveralModulesAndOptimizers) {
  Fabric fabric(one_process());
  fabric.launch();
  auto student = seeded_net();
  auto teacher = seeded_net();
  auto first = sgd(*student);
  auto second = std::make_shared<torch::optim::Adam>(student->parameters(), 1e-3);
  auto [model, opt_a, opt_b] = fabric.setup(student, first, second);
  EXPECT_EQ(opt_a.optimizer(), first);
  EXPECT_EQ(opt_b.optimizer(), second);
  auto frozen = fabric.setup_module(teacher);
  auto [opt_c, opt_d] = fabric.setup_optimizers(sgd(*teacher), sgd(*teacher));
  EXPECT_NE(opt_c.optimizer(), opt_d.optimizer());
  const auto x = testing::regression_data(8)->get_batch({0, 1, 2, 3}).data;
  torch::Tensor target;
  {
    torch::NoGradGuard no_grad;
    target = frozen(x);
  }
  const auto before = student->parameters()[0].clone();
  fabric.backward(torch::mse_loss(model(x), target + 1.0));
  EXPECT_TRUE(opt_a->step());
  EXPECT_FALSE(student->parameters()[0].equal(before)) << "optimizer->step() must step";
  EXPECT_FALSE(teacher->parameters()[0].grad().defined()) << "the teacher took no part";
}

TEST(Fabric, NoBackwardSyncAccumulationEqualsTheWholeBatch) {
  const auto data = testing::regression_data(32);
  auto whole = seeded_net();
  auto parts = seeded_net();
  Fabric fabric(one_process());
  fabric.launch();
  auto [model, optimizer] = fabric.setup(parts, sgd(*parts));
  {
    const Batch all = DataLoader(data, DataLoaderOptions(32)).batch(0);
    torch::mse_loss(whole->forward(all.data), all.target).backward();
  }
  auto loader = fabric.setup_dataloaders(std::make_shared<DataLoader>(data, DataLoaderOptions(8)));
  ASSERT_EQ(loader.num_batches(), 4);
  EXPECT_EQ(&*loader, &loader) << "`for (Batch& batch : *loader)` reads as over the plain loader";
  int64_t i = 0;
  for (Batch& batch : loader) {
    auto guard = fabric.no_backward_sync(model, i < 3);
    fabric.backward(torch::mse_loss(model(batch.data), batch.target) / 4.0);
    ++i;
  }
  EXPECT_EQ(i, 4);
  EXPECT_LE(max_diff(grads(*whole), grads(*parts)), 1e-6);
}

TEST(Fabric, ClipGradientsBoundsTheNormAndReturnsItsValueBefore) {
  auto net = seeded_net();
  Fabric fabric(one_process());
  fabric.launch();
  auto [model, optimizer] = fabric.setup(net, sgd(*net));
  const Batch batch = DataLoader(testing::regression_data(16), DataLoaderOptions(16)).batch(0);
  fabric.backward(100.0 * torch::mse_loss(model(batch.data), batch.target));
  auto norm_of = [&] {
    double sum = 0;
    for (const auto& g : grads(*net)) sum += g.pow(2).sum().item<double>();
    return std::sqrt(sum);
  };
  const double before = norm_of();
  ASSERT_GT(before, 0.5);
  EXPECT_NEAR(fabric.clip_gradients(optimizer, 0.5).item<double>(), before, 1e-4 * before);
  EXPECT_NEAR(norm_of(), 0.5, 1e-4);
  fabric.clip_gradients_value(optimizer, 0.01);
  for (const auto& g : grads(*net)) EXPECT_LE(g.abs().max().item<double>(), 0.01 + 1e-9);
  EXPECT_THROW(fabric.clip_gradients(optimizer, 0.0), UsageError);
}

// Lightning's error_if_nonfinite (default true): an inf gradient norm is an error of kind
// training that leaves the gradients as they were; with false they are clipped anyway.
TEST(Fabric, ClipGradientsRefusesANonFiniteNormByDefault) {
  auto net = seeded_net();
  Fabric fabric(one_process());
  fabric.launch();
  auto [model, optimizer] = fabric.setup(net, sgd(*net));
  fabric.backward(model(torch::ones({2, 8})).sum());
  net->fc1->weight.grad()[0][0] = std::numeric_limits<float>::infinity();
  const auto before = grads(*net);
  try {
    fabric.clip_gradients(optimizer, 1.0);
    ADD_FAILURE() << "an inf norm was clipped";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::training);
    EXPECT_NE(std::string(e.what()).find("error_if_nonfinite = false"), std::string::npos) << e.what();
  }
  for (size_t i = 0; i < before.size(); ++i) EXPECT_TRUE(before[i].equal(grads(*net)[i])) << "gradient " << i;
  EXPECT_TRUE(std::isinf(fabric.clip_gradients(optimizer, 1.0, 2.0, /*error_if_nonfinite=*/false).item<double>()));
}

// init_module makes the parameters in the precision's dtype; logger() is the first logger added.
TEST(Fabric, InitModuleAndLogger) {
  Fabric fabric(one_process().precision("64-true"));
  fabric.launch();
  auto net = fabric.init_module([] { return std::make_shared<Net>(); });
  for (const auto& p : net->parameters()) EXPECT_EQ(p.scalar_type(), torch::kFloat64);
  EXPECT_EQ(torch::ones({1}).scalar_type(), torch::kFloat32) << "the default dtype is restored";
  EXPECT_EQ(fabric.accelerator(), accelerators::Accelerator::cpu);
  EXPECT_THROW(fabric.logger(), UsageError);
  testing::TempDir dir("lockstep_fabric_logger");
  auto csv = std::make_shared<loggers::CSVLogger>(loggers::LoggerOptions(dir.path()));
  fabric.add_logger(csv);
  EXPECT_EQ(&fabric.logger(), csv.get());
}

TEST(Fabric, AutocastFollowsThePrecision) {
  const auto a = torch::randn({4, 4}), b = torch::randn({4, 4});
  {
    Fabric fabric(one_process().precision("bf16-mixed"));
    fabric.launch();
    auto scope = fabric.autocast();
    EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kBFloat16);
  }
  EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kFloat32) << "autocast ends with the scope";
  Fabric fabric(one_process());
  fabric.launch();
  auto scope = fabric.autocast();
  EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kFloat32);
}

TEST(Fabric, SixtyFourTrueConvertsTheModuleAndTheBatches) {
  auto net = seeded_net();
  Fabric fabric(one_process().precision("64-true"));
  fabric.launch();
  auto [model, optimizer] = fabric.setup(net, sgd(*net));
  auto loader = fabric.setup_dataloaders(std::make_shared<DataLoader>(testing::regression_data(8), DataLoaderOptions(8)));
  Batch batch = loader.batch(0);
  EXPECT_EQ(net->fc1->weight.scalar_type(), torch::kFloat64);
  EXPECT_EQ(batch.data.scalar_type(), torch::kFloat64);
  EXPECT_EQ(model(batch.data).scalar_type(), torch::kFloat64);
}

TEST(Fabric, CollectivesOnOneProcessReturnTheirInput) {
  Fabric fabric(one_process());
  fabric.launch();
  const auto t = torch::tensor({1.0, 2.0});
  EXPECT_TRUE(fabric.all_reduce(t, distributed::ReduceOp::sum).equal(t));
  EXPECT_DOUBLE_EQ(fabric.all_reduce(2.5), 2.5);
  EXPECT_EQ(fabric.all_gather(t).sizes(), (std::vector<int64_t>{1, 2}));
  EXPECT_TRUE(fabric.broadcast(t).equal(t));
  EXPECT_EQ(fabric.broadcast(c10::IValue("hello")).toStringRef(), "hello");
  fabric.barrier("alone");
}

TEST(Fabric, PrintWritesOneLineOnRankZero) {
  Fabric fabric(one_process());
  fabric.launch();
  ::testing::internal::CaptureStdout();
  fabric.print("step ", 3, " loss ", 0.5);
  EXPECT_EQ(::testing::internal::GetCapturedStdout(), "step 3 loss 0.5\n");
}

TEST(Fabric, SeedEverythingRepeatsTheDraws) {
  Fabric fabric(one_process());
  fabric.seed_everything(5);
  const auto first = torch::randn({3});
  fabric.seed_everything(5);
  EXPECT_TRUE(torch::randn({3}).equal(first));
}

TEST(Fabric, LogAndLogDictReachTheLoggers) {
  testing::TempDir dir("lockstep_fabric_log");
  Fabric fabric(one_process());
  auto csv = std::make_shared<loggers::CSVLogger>(loggers::LoggerOptions(dir.path()).version(0));
  fabric.add_logger(csv);
  fabric.launch();
  fabric.log("loss", 0.25, 1);
  fabric.log_dict({{"loss", 0.125}, {"acc", 0.5}}, 2);
  const std::string csv_text = testing::slurp(csv->log_dir() + "/metrics.csv");
  EXPECT_NE(csv_text.find("1,0.25"), std::string::npos) << csv_text;
  EXPECT_NE(csv_text.find("0.125"), std::string::npos) << csv_text;
  EXPECT_NE(csv_text.find("acc"), std::string::npos) << csv_text;
}

// Trains two steps, saves, trains on; a fresh module and optimizer loaded from the file continue
// exactly as the original does.
TEST(Fabric, SaveAndLoadRoundTrip) {
  testing::TempDir dir("lockstep_fabric_ckpt");
  const Batch batch = DataLoader(testing::regression_data(16), DataLoaderOptions(16)).batch(0);
  auto net = seeded_net();
  Fabric fabric(one_process());
  fabric.launch();
  auto [model, optimizer] = fabric.setup(net, sgd(*net));
  auto train_step = [&](Net& n, torch::optim::Optimizer& o) {
    o.zero_grad();
    torch::mse_loss(n.forward(batch.data), batch.target).backward();
    o.step();
  };
  for (int i = 0; i < 2; ++i) train_step(*net, *optimizer.optimizer());
  fabric.save(dir / "fabric.ckpt", {{"state_dict", model}, {"optimizer", optimizer}, {"step", int64_t{2}},
                                    {"note", std::string("two steps")}});

  torch::manual_seed(99);
  auto other = std::make_shared<Net>();
  auto other_sgd = sgd(*other);
  FabricState state{{"state_dict", other}, {"optimizer", other_sgd}, {"step", int64_t{0}}};
  const auto rest = fabric.load(dir / "fabric.ckpt", state);
  EXPECT_EQ(max_diff(net->parameters(), other->parameters()), 0.0);
  EXPECT_EQ(state.at("step").value().toInt(), 2);
  ASSERT_TRUE(rest.contains("note"));
  EXPECT_EQ(rest.at("note").toStringRef(), "two steps");
  EXPECT_FALSE(rest.contains("state_dict"));
  train_step(*net, *optimizer.optimizer());
  train_step(*other, *other_sgd);
  EXPECT_EQ(max_diff(net->parameters(), other->parameters()), 0.0) << "the momentum must be restored too";

  FabricState missing{{"scheduler", int64_t{0}}};
  try {
    fabric.load(dir / "fabric.ckpt", missing);
    ADD_FAILURE() << "no error for a missing key";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("scheduler"), std::string::npos) << e.what();
  }
  EXPECT_THROW(fabric.load(dir / "absent.ckpt", state), UsageError);
}

// Checkpoints kept in memory, by path (a CheckpointIO that stores them elsewhere).
struct InMemoryCheckpoints : checkpoint::CheckpointIO {
  void save(const c10::IValue& checkpoint, const std::string& path) const override {
    saved.insert_or_assign(path, checkpoint);
  }
  checkpoint::Checkpoint load(const std::string& path) const override {
    loaded.push_back(path);
    return saved.at(path).toGenericDict();
  }
  mutable std::map<std::string, c10::IValue> saved;
  mutable std::vector<std::string> loaded;
};

// Lightning Fabric's plugins=[checkpoint_io]: save, load and load_raw go through it.
TEST(Fabric, SaveAndLoadGoThroughTheCheckpointIO) {
  testing::TempDir dir("lockstep_fabric_io");
  auto io = std::make_shared<InMemoryCheckpoints>();
  Fabric fabric(one_process());
  EXPECT_THROW(fabric.set_checkpoint_io(nullptr), UsageError);
  fabric.set_checkpoint_io(io);
  EXPECT_EQ(&fabric.checkpoint_io(), io.get());
  fabric.launch();
  auto net = seeded_net();
  auto model = fabric.setup_module(net);
  const std::string path = dir / "fabric.ckpt";
  fabric.save(path, {{"model", model}, {"step", int64_t{7}}});
  EXPECT_FALSE(std::filesystem::exists(path)) << "the default CheckpointIO wrote the file";
  ASSERT_EQ(io->saved.count(path), 1u);

  torch::manual_seed(99);
  auto other = std::make_shared<Net>();
  FabricState state{{"model", other}, {"step", int64_t{0}}};
  fabric.load(path, state);
  EXPECT_EQ(max_diff(net->parameters(), other->parameters()), 0.0);
  EXPECT_EQ(state.at("step").value().toInt(), 7);
  EXPECT_EQ(fabric.load(path).at("step").toInt(), 7);
  EXPECT_EQ(io->loaded, (std::vector<std::string>{path, path}));
}

TEST(Fabric, PythonTorchLoadReadsTheSavedFile) {
  if (!std::filesystem::exists(LOCKSTEP_TEST_PYTHON)) GTEST_SKIP() << LOCKSTEP_TEST_PYTHON << " is not installed";
  testing::TempDir dir("lockstep_fabric_python");
  auto net = seeded_net();
  Fabric fabric(one_process());
  fabric.launch();
  auto [model, optimizer] = fabric.setup(net, sgd(*net));
  fabric.save(dir / "fabric.ckpt", {{"state_dict", model}, {"optimizer", optimizer}, {"step", int64_t{7}}});
  const char* reader = R"(
import sys, torch
ckpt = torch.load(sys.argv[1])
print("keys", ",".join(sorted(ckpt)))
print("params", ",".join(ckpt["state_dict"]))
print("step", ckpt["step"])
print("groups", len(ckpt["optimizer"]["param_groups"]), ckpt["optimizer"]["param_groups"][0]["momentum"])
print("sum", float(sum(t.double().sum() for t in ckpt["state_dict"].values())))
)";
  const auto result = testing::run_command({LOCKSTEP_TEST_PYTHON, "-c", reader, dir / "fabric.ckpt"},
                                           {{"OMP_NUM_THREADS", "1"}, {"HOME", dir.path()}}, std::chrono::seconds(60));
  if (result.err.find("No module named 'torch'") != std::string::npos) GTEST_SKIP() << "no torch in Python";
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("keys optimizer,state_dict,step\n"), std::string::npos) << result.out;
  EXPECT_NE(result.out.find("params fc1.weight,fc1.bias,fc2.weight,fc2.bias\n"), std::string::npos) << result.out;
  EXPECT_NE(result.out.find("step 7\n"), std::string::npos) << result.out;
  EXPECT_NE(result.out.find("groups 1 0.9\n"), std::string::npos) << result.out;
  double sum = 0;
  for (const auto& p : net->parameters()) sum += p.to(torch::kFloat64).sum().item<double>();
  const auto at = result.out.find("sum ");
  ASSERT_NE(at, std::string::npos) << result.out;
  EXPECT_NEAR(std::stod(result.out.substr(at + 4)), sum, 1e-9);
}

// A Fabric built in code takes LOCKSTEP_TRAINER_* for the options it left at their defaults, as
// the Trainer does; a bad value stops it naming the variable.
TEST(FabricVariables, AFabricBuiltInCodeTakesTheVariablesForItsDefaults) {
  ::setenv("LOCKSTEP_TRAINER_PRECISION", "64-true", 1);
  ::setenv("LOCKSTEP_TRAINER_DEVICES", "3", 1);
  Fabric fabric(one_process());  // devices 1 in code
  ::unsetenv("LOCKSTEP_TRAINER_PRECISION");
  ::unsetenv("LOCKSTEP_TRAINER_DEVICES");
  fabric.launch();
  EXPECT_EQ(fabric.world_size(), 1) << "devices set in code win";
  auto net = fabric.init_module([] { return std::make_shared<Net>(); });
  for (const auto& p : net->parameters()) EXPECT_EQ(p.scalar_type(), torch::kFloat64);

  ::setenv("LOCKSTEP_TRAINER_NUM_NODES", "zero", 1);
  const auto message = [] {
    try {
      Fabric bad{FabricOptions()};
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  }();
  ::unsetenv("LOCKSTEP_TRAINER_NUM_NODES");
  EXPECT_NE(message.find("LOCKSTEP_TRAINER_NUM_NODES=zero is not a whole number"), std::string::npos) << message;
}

}  // namespace
}  // namespace lockstep
