// Predict and validation on several ranks: predict splits the loader as Lightning's
// UnrepeatedDistributedSampler (every example once) and gathers the outputs in dataset order
// (PredictOptions::gather); validation leaves the padded sampler's repeats out of its metrics.
// In-process cases see the Trainer as one rank of three (a strategy that says so); the job cases
// run tests/programs/predict_program on 1 and 3 processes.
#include <lockstep/trainer/trainer.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <lockstep/distributed/rank_zero.h>
#include <lockstep/strategies/strategy.h>

#include "../../support/command.h"
#include "../../support/paths.h"
#include "../../support/trainer_runs.h"

namespace lockstep {
namespace trainer_predict_test {
namespace {

// This process as rank `rank` of 3 to the Trainer (its collectives are those of one process).
struct OneRankOfThree : strategies::SingleDeviceStrategy {
  explicit OneRankOfThree(int rank) : rank(rank) {}
  std::string name() const override { return "one_rank_of_three"; }
  int world_size() const override { return 3; }
  int global_rank() const override { return rank; }
  std::optional<std::pair<int, int>> distributed_sampler_kwargs() const override { return std::make_pair(3, rank); }
  int rank;
};

// Predicts each example's own number (its one feature) and logs the validation mean of it.
struct Numbers : testing::Regressor {
  Numbers() : Regressor(false, 1) {}
  torch::Tensor predict_step(Batch& batch, int64_t) override { return batch.data.clone(); }
  void validation_step(Batch& batch, int64_t) override {
    log("val_number", batch.data.mean(), LogOptions().sync_dist(true));
  }
};

// Examples 0..n-1, example i's one feature being i.
std::shared_ptr<DataLoader> numbered(int64_t n, int64_t batch_size, bool shuffle = false) {
  auto data = std::make_shared<TensorDataset>(torch::arange(n, torch::kFloat32).unsqueeze(1), torch::zeros({n, 1}));
  return std::make_shared<DataLoader>(data, DataLoaderOptions(batch_size).shuffle(shuffle).seed(3));
}

std::vector<int64_t> rows_of(const std::vector<torch::Tensor>& outputs) {
  std::vector<int64_t> rows;
  for (const auto& o : outputs) {
    for (int64_t i = 0; i < o.size(0); ++i) rows.push_back(static_cast<int64_t>(o[i][0].item<float>()));
  }
  return rows;
}

class TrainerPredict : public ::testing::Test {
 protected:
  void TearDown() override { distributed::set_global_rank(0); }  // launch() set it to the strategy's

  std::unique_ptr<Trainer> trainer_as(std::optional<int> rank) {
    auto trainer = std::make_unique<Trainer>(testing::quiet_options(dir));
    if (rank) trainer->set_strategy(std::make_shared<OneRankOfThree>(*rank));
    return trainer;
  }
  testing::TempDir dir{"lockstep_trainer_predict"};
};

// 250 examples on 3 ranks: 84, 83 and 83, none twice (the padded split would give rank 1 84,
// ending on a repeat of example 0).
TEST_F(TrainerPredict, EachRankPredictsItsUnrepeatedShare) {
  for (int rank = 0; rank < 3; ++rank) {
    const auto rows = rows_of(trainer_as(rank)->predict(std::make_shared<Numbers>(), numbered(250, 8)));
    ASSERT_EQ(rows.size(), rank == 0 ? 84u : 83u) << "rank " << rank;
    for (size_t k = 0; k < rows.size(); ++k) ASSERT_EQ(rows[k], rank + 3 * static_cast<int64_t>(k)) << "rank " << rank;
  }
}

// Gathered outputs come in the dataset's order and the loader's batches, even from a shuffled
// loader; with one process that is the only collective-free case this can check in-process.
TEST_F(TrainerPredict, GatherPutsOutputsInDatasetOrder) {
  const auto outputs = trainer_as(std::nullopt)->predict(std::make_shared<Numbers>(), numbered(21, 4, true),
                                                          PredictOptions().gather(true));
  ASSERT_EQ(outputs.size(), 6u);
  EXPECT_EQ(outputs.back().size(0), 1);
  const auto rows = rows_of(outputs);
  ASSERT_EQ(rows.size(), 21u);
  for (int64_t i = 0; i < 21; ++i) EXPECT_EQ(rows[static_cast<size_t>(i)], i);
}

struct OneNumberPerBatch : Numbers {
  torch::Tensor predict_step(Batch& batch, int64_t) override { return batch.data.sum(); }
};

TEST_F(TrainerPredict, GatherRefusesOutputsWithoutARowPerExample) {
  try {
    trainer_as(std::nullopt)->predict(std::make_shared<OneNumberPerBatch>(), numbered(8, 4), PredictOptions().gather(true));
    ADD_FAILURE() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("returned [] for batch 0 of 4 examples"), std::string::npos) << e.what();
  }
}

// Rank 2 of 3 over 250 examples in batches of 83: its share is 84 long, padded, and its second
// batch holds only the repeat of example 1. The batch still runs (the ranks step together) but
// counts nothing: the epoch mean is that of its 83 own examples, 2, 5, ..., 248.
TEST_F(TrainerPredict, ValidationCountsNoRepeat) {
  for (int64_t batch_size : {83, 8}) {
    auto trainer = trainer_as(2);
    ::testing::internal::CaptureStderr();
    const auto metrics = trainer->validate(std::make_shared<Numbers>(), numbered(250, batch_size));
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(trainer->num_val_batches(), batch_size == 83 ? 2 : 11);
    EXPECT_DOUBLE_EQ(metrics.at("val_number"), 125.0) << "batch size " << batch_size << "; with the repeat: "
                                                     << (125.0 * 83 + 1) / 84;
    EXPECT_EQ(err.find("pads"), std::string::npos) << "rank 2 is silent: " << err;
  }
}

TEST_F(TrainerPredict, RankZeroSaysOnceWhatThePaddingDoes) {
  auto trainer = trainer_as(0);
  auto loader = numbered(250, 8);
  ::testing::internal::CaptureStderr();
  trainer->validate(std::make_shared<Numbers>(), loader);
  trainer->validate(std::make_shared<Numbers>(), loader);
  const std::string err = ::testing::internal::GetCapturedStderr();
  const std::string line = "lockstep: validation on 3 ranks: the DistributedSampler pads 250 examples to 252 (84 a "
                           "rank) by repeating 2; the repeats run but count nothing in the validation metrics.\n";
  EXPECT_EQ(err, line);
}

// The job: 3 processes against 1, over 250 examples.
class TrainerPredictJob : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = std::filesystem::temp_directory_path() / ("trainer_predict_job_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
  }
  void TearDown() override { std::filesystem::remove_all(dir); }

  testing::CommandResult run(const std::string& name, std::vector<std::string> flags) {
    const auto out = dir / name;
    std::filesystem::create_directories(out);
    std::vector<std::string> argv{std::string(LOCKSTEP_BIN_DIR) + "/../tests/predict_program", "--out", out.string(),
                                  "--default-root-dir", (dir / "runs").string(), "--timeout", "60"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    auto result = testing::run_command(argv, {{"PATH", "/usr/bin:/bin"}, {"OMP_NUM_THREADS", "1"}},
                                       std::chrono::seconds(90));
    EXPECT_EQ(result.exit_code, 0) << name << ": " << result.err;
    return result;
  }
  std::vector<torch::Tensor> outputs(const std::string& name, const std::string& what, int rank) {
    std::vector<torch::Tensor> tensors;
    torch::load(tensors, (dir / name / (what + "." + std::to_string(rank) + ".pt")).string());
    return tensors;
  }
  double val_loss(const std::string& name, int rank, int64_t batch_size) {
    return std::stod(testing::slurp((dir / name / ("val." + std::to_string(rank) + "." + std::to_string(batch_size))).string()));
  }
  static int64_t rows(const std::vector<torch::Tensor>& tensors) {
    int64_t n = 0;
    for (const auto& t : tensors) n += t.size(0);
    return n;
  }

  std::filesystem::path dir;
};

// The gathered batches against one process's: the same shapes, each example's features (columns
// 0-7) bit for bit, the model's output (column 8) to 1e-6. Returns how many outputs differ and the
// largest difference.
std::pair<int64_t, double> expect_same_batches(const std::vector<torch::Tensor>& got,
                                               const std::vector<torch::Tensor>& want, const std::string& what) {
  EXPECT_EQ(got.size(), want.size()) << what;
  int64_t differ = 0;
  double worst = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    EXPECT_EQ(got[i].sizes(), want[i].sizes()) << what << ": batch " << i;
    if (got[i].sizes() != want[i].sizes()) continue;
    EXPECT_TRUE(torch::equal(got[i].narrow(1, 0, 8), want[i].narrow(1, 0, 8))) << what << ": batch " << i;
    const auto output = (got[i].narrow(1, 8, 1) - want[i].narrow(1, 8, 1)).abs();
    EXPECT_LE(output.max().item<double>(), 1e-6) << what << ": batch " << i;
    differ += output.ne(0).sum().item<int64_t>();
    worst = std::max(worst, output.max().item<double>());
  }
  return {differ, worst};
}

TEST_F(TrainerPredictJob, ThreeRanksPredictAndValidateAsOneProcess) {
  run("one", {"--devices", "1"});
  for (const char* strategy : {"ddp", "fsdp"}) {
    const std::string name = std::string("three_") + strategy;
    const auto job = run(name, {"--devices", "3", "--strategy", strategy});
    const auto single = outputs("one", "own", 0);
    ASSERT_EQ(rows(single), 250);
    for (int rank = 0; rank < 3; ++rank) {
      EXPECT_EQ(rows(outputs(name, "own", rank)), rank == 0 ? 84 : 83) << strategy << " rank " << rank;
      const auto [differ, worst] =
          expect_same_batches(outputs(name, "gathered", rank), single, name + " on rank " + std::to_string(rank));
      if (rank == 0) std::cout << "[ predict ] " << strategy << ": 250 rows gathered in order; outputs not bit-equal to "
                               << "one process's: " << differ << ", by at most " << worst << "\n";
    }
    EXPECT_TRUE(torch::equal(outputs(name, "own", 1)[0][0], single[0][1])) << "rank 1 starts at example 1";
    for (int64_t batch_size : {8, 83}) {
      const double one = val_loss("one", 0, batch_size), three = val_loss(name, 0, batch_size);
      EXPECT_NEAR(three, one, 1e-6) << strategy << ", batches of " << batch_size;
      std::cout << "[ val_loss ] " << strategy << ", 3 ranks, batches of " << batch_size << ": " << three
                << "; 1 process: " << one << "; |diff| " << std::abs(three - one) << "\n";
    }
    std::istringstream err(job.err);
    int notices = 0;
    for (std::string line; std::getline(err, line);) notices += line.find("pads 250 examples to 252") != std::string::npos;
    EXPECT_EQ(notices, 2) << "one line for each of the two validation loaders:\n" << job.err;
  }
}

}  // namespace
}  // namespace trainer_predict_test
}  // namespace lockstep
