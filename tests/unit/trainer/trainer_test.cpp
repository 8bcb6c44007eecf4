#include <lockstep/trainer/trainer.h>

#include <filesystem>
#include <fstream>
#include <numeric>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <lockstep/checkpoint/checkpoint_io.h>
#include <lockstep/core/error.h>

#include "../../support/heap_probe.h"
#include "../../support/regression.h"
#include "../../support/scheduler_environment.h"

namespace lockstep {
namespace {

using testing::Regressor;
using testing::regression_data;

class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    torch::set_num_threads(1);
    root = std::filesystem::temp_directory_path() / ("trainer_test_" + std::to_string(::getpid()));
    std::filesystem::remove_all(root);
  }
  void TearDown() override { std::filesystem::remove_all(root); }
  TrainerOptions options() const {
    return TrainerOptions().max_epochs(3).enable_progress_bar(false).num_sanity_val_steps(0).default_root_dir(
        root.string());
  }
  std::filesystem::path root;
};

// What Trainer::fit must equal: the plain LibTorch loop, same data order, same optimizer.
void hand_written_loop(Regressor& model, Dataset& data, int64_t batch_size, int epochs) {
  auto opt = model.configure_optimizers().optimizers[0];
  DataLoader loader(std::shared_ptr<Dataset>(&data, [](Dataset*) {}), DataLoaderOptions(batch_size));
  for (int e = 0; e < epochs; ++e) {
    for (int64_t i = 0; i < loader.num_batches(); ++i) {
      Batch b = loader.batch(i);
      auto loss = torch::mse_loss(model.forward(b.data), b.target);
      loss.backward();
      opt->step();
      opt->zero_grad();
    }
  }
}

TEST_F(TrainerTest, FitEqualsTheHandWrittenLoopBitForBit) {
  for (bool adam : {false, true}) {
    auto data = regression_data(96);
    torch::manual_seed(1);
    auto model = std::make_shared<Regressor>(adam);
    torch::manual_seed(1);
    Regressor reference(adam);
    ASSERT_EQ(testing::max_abs_diff(*model, reference), 0.0);
    Trainer trainer(options());
    trainer.fit(model, std::make_shared<DataLoader>(data, DataLoaderOptions(16)));
    hand_written_loop(reference, *data, 16, 3);
    EXPECT_EQ(testing::max_abs_diff(*model, reference), 0.0) << (adam ? "Adam" : "SGD");
    EXPECT_EQ(trainer.global_step(), 18);
    EXPECT_EQ(trainer.current_epoch(), 3);
  }
}

#ifdef __GLIBC__
// fit tunes the heap for training (core/heap.h): a 24 MiB block comes from the heap afterwards.
TEST_F(TrainerTest, FitTunesTheHeapForTraining) {
  testing::small_mmap_threshold();
  ASSERT_FALSE(testing::heap_serves(24 << 20));
  Trainer trainer(options().max_epochs(1));
  trainer.fit(std::make_shared<Regressor>(false), std::make_shared<DataLoader>(regression_data(32), DataLoaderOptions(16)));
  EXPECT_TRUE(testing::heap_serves(24 << 20));
}
#endif

TEST_F(TrainerTest, LogsStepAndEpochMetricsToCsv) {
  auto data = regression_data(64);
  auto model = std::make_shared<Regressor>();
  Trainer trainer(options().log_every_n_steps(2));
  trainer.fit(model, std::make_shared<DataLoader>(data, DataLoaderOptions(16)),
              std::make_shared<DataLoader>(regression_data(32, 8, 9), DataLoaderOptions(16)));
  ASSERT_TRUE(trainer.callback_metrics().count("val_loss"));
  ASSERT_TRUE(trainer.callback_metrics().count("train_loss"));
  EXPECT_TRUE(trainer.progress_bar_metrics().count("train_loss"));
  EXPECT_FALSE(trainer.progress_bar_metrics().count("val_loss"));
  const auto csv = std::filesystem::path(trainer.log_dir()) / "metrics.csv";
  ASSERT_TRUE(std::filesystem::exists(csv)) << csv;
  std::ifstream in(csv);
  std::string header;
  std::getline(in, header);
  EXPECT_NE(header.find("val_loss"), std::string::npos) << header;
  EXPECT_NE(header.find("train_loss"), std::string::npos) << header;
  int rows = 0;
  for (std::string line; std::getline(in, line);) ++rows;
  EXPECT_EQ(rows, 3 * 2 + 3) << "every 2nd of 12 steps, plus one validation row per epoch";
}

TEST_F(TrainerTest, ValidationLossIsTheBatchWeightedMean) {
  auto data = regression_data(40);  // batches of 16, 16, 8
  auto model = std::make_shared<Regressor>();
  Trainer trainer(options());
  auto metrics = trainer.validate(model, std::make_shared<DataLoader>(data, DataLoaderOptions(16)));
  torch::NoGradGuard no_grad;
  std::vector<int64_t> all(40);
  std::iota(all.begin(), all.end(), 0);
  Batch everything = data->get_batch(all);
  auto expected = torch::mse_loss(model->forward(everything.data), everything.target);
  EXPECT_NEAR(metrics.at("val_loss"), expected.item<double>(), 1e-6);
}

TEST_F(TrainerTest, ResumeIsExact) {
  auto data = regression_data(64);
  auto run = [&](TrainerOptions o, uint64_t seed, const std::string& save_to) {
    torch::manual_seed(seed);
    auto model = std::make_shared<Regressor>(true);
    Trainer trainer(o);
    trainer.fit(model, std::make_shared<DataLoader>(data, DataLoaderOptions(16).shuffle(true).seed(3)));
    if (!save_to.empty()) trainer.save_checkpoint(save_to);
    return model;
  };
  auto straight = run(options().max_epochs(4), 5, "");
  const std::string ckpt = (root / "half.ckpt").string();
  run(options().max_epochs(2), 5, ckpt);
  auto resumed = run(options().max_epochs(4).ckpt_path(ckpt), 99, "");  // other init: must be overwritten
  EXPECT_EQ(testing::max_abs_diff(*straight, *resumed), 0.0);
}

// --ckpt-path last before any run saved one (the first attempt of a restarted job) trains from the
// start after a note, as Lightning's ckpt_path="last" does.
TEST_F(TrainerTest, LastWithoutACheckpointTrainsFromTheStartAfterANote) {
  auto data = regression_data(32);
  ::testing::internal::CaptureStderr();
  Trainer trainer(options().max_epochs(1).ckpt_path("last"));
  trainer.fit(std::make_shared<Regressor>(), std::make_shared<DataLoader>(data, DataLoaderOptions(16)));
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("--ckpt-path last: no version_N/checkpoints/last.ckpt under"), std::string::npos) << err;
  EXPECT_NE(err.find("training from the start"), std::string::npos) << err;
  EXPECT_EQ(trainer.global_step(), 2);
}

// A resumed run says once where it writes, and links back to the run that wrote the checkpoint
// (for `lockstep plot`).
TEST_F(TrainerTest, AResumedRunSaysWhereItWritesAndLinksToItsOrigin) {
  auto data = regression_data(32);
  std::string first_dir;
  {
    Trainer trainer(options().max_epochs(1));
    trainer.fit(std::make_shared<Regressor>(), std::make_shared<DataLoader>(data, DataLoaderOptions(16)));
    first_dir = std::filesystem::absolute(trainer.log_dir()).string();
  }
  ::testing::internal::CaptureStderr();
  Trainer resumed(options().max_epochs(2).ckpt_path("last"));
  resumed.fit(std::make_shared<Regressor>(), std::make_shared<DataLoader>(data, DataLoaderOptions(16)));
  const std::string err = ::testing::internal::GetCapturedStderr();
  const std::string here = std::filesystem::absolute(resumed.log_dir()).string();
  EXPECT_NE(err.find("lockstep: resuming from " + first_dir + "/checkpoints/last.ckpt (epoch 1, step 2); this run "
                     "writes its logs and checkpoints to " + here + " (the run it resumes wrote to " + first_dir),
            std::string::npos) << err;
  std::ifstream link(std::filesystem::path(here) / "resumed_from");
  std::string origin;
  std::getline(link, origin);
  EXPECT_EQ(origin, first_dir);
  EXPECT_EQ(err.find("ModelCheckpoint: the resumed checkpoint"), std::string::npos) << "said twice: " << err;
}

TEST_F(TrainerTest, MaxStepsAndLimitBatchesAndAccumulation) {
  auto data = regression_data(64);
  auto model = std::make_shared<Regressor>();
  Trainer trainer(options().max_epochs(-1).max_steps(5).limit_train_batches(0.5));
  trainer.fit(model, std::make_shared<DataLoader>(data, DataLoaderOptions(8)));
  EXPECT_EQ(trainer.global_step(), 5);
  EXPECT_EQ(trainer.num_training_batches(), 4);
  auto accumulated = std::make_shared<Regressor>();
  Trainer t2(options().max_epochs(1).accumulate_grad_batches(4));
  t2.fit(accumulated, std::make_shared<DataLoader>(data, DataLoaderOptions(8)));
  EXPECT_EQ(t2.global_step(), 2);
}

// --benchmark sets LibTorch's cudnn.benchmark flag at fit (both ways), and on the CPU says that
// it changes nothing there.
TEST_F(TrainerTest, BenchmarkSetsTheCudnnFlagAndSaysItDoesNothingOnTheCpu) {
  auto data = regression_data(32);
  for (bool benchmark : {true, false}) {
    at::globalContext().setBenchmarkCuDNN(!benchmark);
    ::testing::internal::CaptureStderr();
    Trainer trainer(options().max_epochs(1).benchmark(benchmark));
    trainer.fit(std::make_shared<Regressor>(false), std::make_shared<DataLoader>(data, DataLoaderOptions(16)));
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(at::globalContext().benchmarkCuDNN(), benchmark);
    EXPECT_EQ(err.find("--benchmark true has no effect on the CPU") != std::string::npos, benchmark) << err;
  }
}

// A valid archive with the Trainer's keys but other contents (a checkpoint of something else):
// one usage error naming the key and what it should hold, not LibTorch's raw type error.
// Lightning's Trainer(plugins=[MyClusterEnvironment()]): the Trainer runs in the user's
// environment instead of the detected one.
TEST_F(TrainerTest, SetClusterEnvironmentReplacesTheDetectedOne) {
  const auto mine = testing::scheduler_environment(0, 1, 1, "127.0.0.1", 29500);
  Trainer trainer(options());
  EXPECT_THROW(trainer.set_cluster_environment(nullptr), UsageError);
  trainer.set_cluster_environment(mine);
  trainer.validate(std::make_shared<Regressor>(), std::make_shared<DataLoader>(regression_data(32), DataLoaderOptions(16)));
  EXPECT_EQ(trainer.strategy().context().environment, mine);
  EXPECT_EQ(trainer.strategy().name(), "single_device") << "auto: its one process";
  EXPECT_THROW(trainer.set_cluster_environment(mine), UsageError) << "after the job started";
}

TEST_F(TrainerTest, ACheckpointOfSomethingElseIsAUsageErrorNamingTheKey) {
  auto data = regression_data(16);
  const std::string path = (root / "other.ckpt").string();
  const std::string good = (root / "good.ckpt").string();
  {
    Trainer trainer(options().max_epochs(1));
    trainer.fit(std::make_shared<Regressor>(), std::make_shared<DataLoader>(data, DataLoaderOptions(8)));
    trainer.save_checkpoint(good);
  }
  // The good checkpoint with one key's value replaced.
  const auto with = [&](const std::string& key, c10::IValue value) {
    auto ckpt = checkpoint::CheckpointIO().load(good);
    ckpt.insert_or_assign(key, std::move(value));
    return ckpt;
  };
  const std::vector<std::tuple<std::string, c10::IValue, std::string>> cases{
      {"state_dict", c10::IValue(int64_t{5}), "\"state_dict\" should hold a dict of parameter and buffer names to tensors"},
      {"optimizer_states", c10::IValue(std::string("adam")), "\"optimizer_states\" should hold a list of optimizer state dicts"},
      {"global_step", c10::IValue(std::string("four")), "\"global_step\" should hold an integer"},
      {"loops", c10::IValue(int64_t{2}), "\"loops\" should hold a dict with the integer next_epoch"},
  };
  for (const auto& [key, value, needle] : cases) {
    checkpoint::CheckpointIO().save(with(key, value), path);
    try {
      Trainer(options().ckpt_path(path)).fit(std::make_shared<Regressor>(), std::make_shared<DataLoader>(data, DataLoaderOptions(8)));
      ADD_FAILURE() << key << ": accepted";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("other.ckpt"), std::string::npos) << e.what();
    }
  }
}

// A fit that trains nothing says so and why, instead of exiting 0 with empty metrics.
TEST_F(TrainerTest, AFitThatTrainsNothingSaysWhy) {
  auto data = regression_data(16);
  const auto fit_and_capture = [&](TrainerOptions o) {
    ::testing::internal::CaptureStderr();
    Trainer(o).fit(std::make_shared<Regressor>(), std::make_shared<DataLoader>(data, DataLoaderOptions(8)));
    return ::testing::internal::GetCapturedStderr();
  };
  std::string err = fit_and_capture(options().max_epochs(0));
  EXPECT_NE(err.find("lockstep: warning: fit trained nothing: --max-epochs 0. Raise --max-epochs to train."),
            std::string::npos) << err;
  const std::string ckpt = (root / "two.ckpt").string();
  {
    Trainer trainer(options().max_epochs(2));
    trainer.fit(std::make_shared<Regressor>(), std::make_shared<DataLoader>(data, DataLoaderOptions(8)));
    trainer.save_checkpoint(ckpt);
  }
  err = fit_and_capture(options().max_epochs(2).ckpt_path(ckpt));
  EXPECT_NE(err.find("ends at epoch 2, step 4, which already reaches --max-epochs 2"), std::string::npos) << err;
  err = fit_and_capture(options().max_epochs(3));
  EXPECT_EQ(err.find("trained nothing"), std::string::npos) << err;
}

TEST_F(TrainerTest, BadSettingsAreUsageErrors) {
  auto data = regression_data(16);
  auto loader = [&] { return std::make_shared<DataLoader>(data, DataLoaderOptions(8)); };
  auto expect_usage = [&](TrainerOptions o, const std::string& needle) {
    try {
      Trainer(o).fit(std::make_shared<Regressor>(), loader());
      ADD_FAILURE() << "accepted; expected " << needle;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_usage(options().strategy("deepspeed"), "Use --strategy ddp");
  expect_usage(options().strategy("nope"), "not registered");
  expect_usage(options().precision("16-mixed"), "bf16-mixed");
  expect_usage(options().precision("8"), "Use 32-true");
  expect_usage(options().strategy("single_device").devices("2"), "Use --strategy ddp");
  expect_usage(options().num_nodes(2), "lockstep launch --nnodes 2");
  expect_usage(options().ckpt_path((root / "missing.ckpt").string()), "missing.ckpt");
}

}  // namespace
}  // namespace lockstep
