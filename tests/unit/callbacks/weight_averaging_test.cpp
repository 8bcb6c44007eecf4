// EMAWeightAveraging and StochasticWeightAveraging: their averages against ones computed here
// from the weights after each update, under 2-rank DDP and FSDP (tests/programs/averaging_program
// as real processes); resuming bit for bit; what checkpoints carry; the options refused.
#include <lockstep/callbacks/stochastic_weight_averaging.h>
#include <lockstep/callbacks/weight_averaging.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <lockstep/checkpoint/checkpoint_io.h>
#include <lockstep/core/error.h>

#include "../../support/command.h"
#include "../../support/paths.h"
#include "../../support/temp_dir.h"

namespace lockstep {
namespace weight_averaging_test {
namespace {

namespace fs = std::filesystem;

// One job of averaging_program: what it said and what each rank wrote.
struct Job {
  testing::CommandResult result;
  fs::path out;
  std::vector<std::vector<torch::Tensor>> records(int rank) const { return load("records", rank); }
  std::vector<torch::Tensor> final_of(int rank) const { return load("final", rank).front(); }
  std::string counts(int rank) const {
    std::string text;
    std::getline(std::ifstream(out / ("counts." + std::to_string(rank))), text);
    return text;
  }

 private:
  std::vector<std::vector<torch::Tensor>> load(const std::string& what, int rank) const {
    std::vector<torch::Tensor> all;
    torch::load(all, (out / (what + "." + std::to_string(rank) + ".pt")).string());
    if (what == "final") return {all};
    std::vector<std::vector<torch::Tensor>> rows;  // [weights, average, lr] per update
    for (size_t i = 0; i + 2 < all.size(); i += 3) rows.push_back({all[i], all[i + 1], all[i + 2]});
    return rows;
  }
};

class WeightAveragingJob : public ::testing::Test {
 protected:
  Job run(const std::string& name, std::vector<std::string> flags) {
    Job job;
    job.out = root() / name;
    fs::create_directories(job.out);
    std::vector<std::string> argv{std::string(testing::bin_dir()) + "/../tests/averaging_program", "--out", job.out.string(),
                                  "--default-root-dir", (root() / "runs" / name).string(), "--timeout", "60",
                                  "--enable-model-summary", "false"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    job.result = testing::run_command(argv, {{"PATH", "/usr/bin:/bin"}, {"OMP_NUM_THREADS", "1"}}, std::chrono::seconds(90));
    return job;
  }
  fs::path checkpoint(const std::string& name, const std::string& file) const {
    return root() / "runs" / name / "lockstep_logs" / "version_0" / "checkpoints" / file;
  }
  fs::path root() const { return fs::path(dir.path()); }
  testing::TempDir dir{"lockstep_weight_averaging"};
};

double max_diff(const torch::Tensor& a, const torch::Tensor& b) {
  EXPECT_EQ(a.numel(), b.numel());
  return a.numel() == 0 ? 0.0 : (a - b).abs().max().item<double>();
}

// The EMA of the recorded weights, computed here in float64: a_1 = w_1, a_k = d a_{k-1} + (1 - d) w_k.
void expect_hand_ema(const Job& job, int rank, double decay, size_t steps) {
  const auto rows = job.records(rank);
  ASSERT_EQ(rows.size(), steps) << "rank " << rank << ": one update per optimizer step";
  torch::Tensor ema;
  double worst = 0;
  for (const auto& row : rows) {
    ema = ema.defined() ? decay * ema + (1 - decay) * row[0] : row[0].clone();
    worst = std::max(worst, max_diff(row[1], ema));
  }
  EXPECT_LE(worst, 1e-6) << "rank " << rank;
  EXPECT_GT(max_diff(rows.back()[0], ema), 1e-3) << "the average must differ from the weights";
  // After fit the module holds the average.
  EXPECT_EQ(max_diff(job.final_of(rank)[0], rows.back()[1]), 0.0) << "rank " << rank;
  std::cout << "[ EMA ] rank " << rank << ": max |average - hand EMA| over " << steps << " steps " << worst << "\n";
}

TEST_F(WeightAveragingJob, EmaEqualsAHandComputedEmaUnderDdpAndFsdp) {
  for (const char* strategy : {"ddp", "fsdp"}) {
    const auto job = run(strategy, {"--devices", "2", "--strategy", strategy, "--max-epochs", "2", "--val",
                                    "--decay", "0.9"});
    ASSERT_EQ(job.result.exit_code, 0) << strategy << ": " << job.result.err;
    for (int rank : {0, 1}) {
      SCOPED_TRACE(strategy);
      expect_hand_ema(job, rank, 0.9, 8);
      EXPECT_EQ(job.counts(rank), "8 8");
    }
    // Validating on the average leaves training as it was: the weights of a run without validation.
    const auto plain = run(std::string(strategy) + "_no_val", {"--devices", "2", "--strategy", strategy, "--max-epochs",
                                                               "2", "--decay", "0.9"});
    ASSERT_EQ(plain.result.exit_code, 0) << plain.result.err;
    EXPECT_TRUE(torch::equal(plain.records(0).back()[0], job.records(0).back()[0])) << strategy;
    const auto a0 = job.records(0).back()[1], a1 = job.records(1).back()[1];
    if (std::string(strategy) == "ddp") {
      EXPECT_EQ(max_diff(a0, a1), 0.0) << "DDP's replicas average alike";
    } else {
      EXPECT_EQ(a0.numel() + a1.numel(), 161) << "FSDP: each rank averages its own piece of the 161 parameters";
    }
  }
}

// A run resumed from the checkpoint of step 6 (mid-epoch) ends with the average, its count and the
// weights of the run that was never stopped, bit for bit; the checkpoint holds the average then.
TEST_F(WeightAveragingJob, ResumesBitForBitAndCheckpointsCarryTheAverage) {
  const std::vector<std::vector<std::string>> setups{
      {"--strategy", "ddp"}, {"--strategy", "fsdp"}, {"--strategy", "fsdp", "--fsdp-state-dict-type", "sharded"}};
  for (size_t s = 0; s < setups.size(); ++s) {
    const std::string name = "resume" + std::to_string(s);
    auto flags = setups[s];
    flags.insert(flags.end(), {"--devices", "2", "--max-epochs", "3", "--decay", "0.8"});
    auto whole = flags;
    whole.insert(whole.end(), {"--checkpoint-every-n-steps", "6"});
    const auto first = run(name, whole);
    ASSERT_EQ(first.result.exit_code, 0) << name << ": " << first.result.err;
    const auto saved = checkpoint(name, "epoch=1-step=6.ckpt");
    auto resumed_flags = flags;
    resumed_flags.insert(resumed_flags.end(), {"--ckpt-path", saved.string()});
    const auto resumed = run(name + "_resumed", resumed_flags);
    ASSERT_EQ(resumed.result.exit_code, 0) << name << ": " << resumed.result.err;
    for (int rank : {0, 1}) {
      const auto a = first.final_of(rank), b = resumed.final_of(rank);
      EXPECT_TRUE(torch::equal(a[0], b[0])) << name << " rank " << rank << ": the weights";
      EXPECT_TRUE(torch::equal(a[1], b[1])) << name << " rank " << rank << ": the average";
      EXPECT_EQ(first.counts(rank), "12 12");
      EXPECT_EQ(resumed.counts(rank), "12 12") << name;
    }
    if (s != 0) continue;
    // DDP's file: the average of step 6, whole, by parameter name.
    const auto ckpt = checkpoint::CheckpointIO().load(saved.string());
    const auto state = ckpt.at("callbacks").toGenericDict().at("EMAWeightAveraging").toGenericDict();
    EXPECT_EQ(state.at("n_averaged").toInt(), 6);
    EXPECT_EQ(state.at("latest_update_step").toInt(), 6);
    std::map<std::string, torch::Tensor> average;
    for (const auto& item : state.at("state_dict").toGenericDict()) {
      average[item.key().toStringRef()] = item.value().toTensor().reshape({-1}).to(torch::kFloat64);
    }
    std::vector<torch::Tensor> flat;
    for (const auto& item : average) flat.push_back(item.second);
    EXPECT_EQ(average.size(), 4u);
    EXPECT_EQ(max_diff(torch::cat(flat), first.records(0).at(5)[1]), 0.0);
  }
}

TEST_F(WeightAveragingJob, DcpCheckpointsRefuseTheAverageByName) {
  const auto job = run("dcp", {"--devices", "2", "--strategy", "fsdp", "--fsdp-state-dict-type", "dcp", "--max-epochs",
                               "1", "--checkpoint-every-n-steps", "2"});
  EXPECT_EQ(job.result.exit_code, 2);
  EXPECT_NE(job.result.err.find("--fsdp-state-dict-type dcp has no place for the weights the callback "
                                "EMAWeightAveraging keeps"), std::string::npos) << job.result.err;
  EXPECT_NE(job.result.err.find("Use --fsdp-state-dict-type sharded"), std::string::npos);
}

// SWA from epoch 3 of 4 (counted from 1): the average is the mean of the weights after epochs 2
// and 3 (0-based); the learning rate anneals from Adam's 0.01 to swa_lr over 1 epoch (cos).
TEST_F(WeightAveragingJob, SwaIsTheMeanOfTheEpochsFromItsStartUnderDdpAndFsdp) {
  for (const char* strategy : {"ddp", "fsdp"}) {
    const auto job = run(std::string("swa_") + strategy,
                         {"--devices", "2", "--strategy", strategy, "--max-epochs", "4", "--average", "swa",
                          "--swa-epoch-start", "3", "--swa-lr", "0.002", "--annealing-epochs", "1"});
    ASSERT_EQ(job.result.exit_code, 0) << strategy << ": " << job.result.err;
    for (int rank : {0, 1}) {
      const auto rows = job.records(rank);
      ASSERT_EQ(rows.size(), 2u) << strategy << ": epochs 2 and 3";
      const auto mean = (rows[0][0] + rows[1][0]) / 2;
      EXPECT_LE(max_diff(rows[1][1], mean), 1e-6) << strategy << " rank " << rank;
      EXPECT_EQ(max_diff(rows[0][1], rows[0][0]), 0.0) << "the first value is copied";
      EXPECT_DOUBLE_EQ(rows[0][2].item<double>(), 0.01) << "epoch 2: the schedule starts at lr0";
      EXPECT_DOUBLE_EQ(rows[1][2].item<double>(), 0.002) << "epoch 3: annealed to swa_lr";
      EXPECT_EQ(max_diff(job.final_of(rank)[0], rows[1][1]), 0.0) << "after fit the module holds the average";
      EXPECT_EQ(job.counts(rank), "2 0");
    }
  }
}

// With batch norm: after fit its running statistics are computed afresh for the average, the
// same on both ranks.
TEST_F(WeightAveragingJob, SwaRecomputesBatchNormStatisticsForTheAverage) {
  const auto job = run("swa_bn", {"--devices", "2", "--strategy", "ddp", "--max-epochs", "3", "--average", "swa",
                                  "--swa-epoch-start", "2", "--batch-norm"});
  ASSERT_EQ(job.result.exit_code, 0) << job.result.err;
  const auto b0 = job.final_of(0)[2], b1 = job.final_of(1)[2];
  ASSERT_EQ(b0.numel(), 16 + 16 + 1) << "running_mean, running_var, num_batches_tracked";
  EXPECT_EQ(max_diff(b0, b1), 0.0);
  EXPECT_EQ(b0[32].item<double>(), 4.0) << "one pass of 4 batches, counted afresh";
  EXPECT_GT(b0.narrow(0, 16, 16).sub(1).abs().max().item<double>(), 1e-3) << "the variance is not the reset 1";
}

TEST(WeightAveragingOptions, BadOptionsAreRefusedWithTheFix) {
  const auto refused = [](const std::function<void()>& make, const std::string& text) {
    try {
      make();
      ADD_FAILURE() << "accepted: " << text;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  refused([] { EMAWeightAveraging(EMAWeightAveragingOptions().decay(1.5)); }, "use a weight of the old average in [0, 1]");
  refused([] { EMAWeightAveraging(EMAWeightAveragingOptions().update_every_n_steps(-1)); }, "use 1 or more");
  refused([] { StochasticWeightAveraging(StochasticWeightAveragingOptions(0.0)); }, "learning rates above 0");
  refused([] { StochasticWeightAveraging(StochasticWeightAveragingOptions(0.1).swa_epoch_start(2.5)); },
          "(an integer, 1 or more)");
  refused([] { StochasticWeightAveraging(StochasticWeightAveragingOptions(0.1).annealing_strategy("step")); },
          "use \"cos\" or \"linear\"");
}

// Lightning's EMAWeightAveraging.should_update, case by case.
TEST(WeightAveragingOptions, EmaUpdatesWhenLightningsDoes) {
  EMAWeightAveraging every(EMAWeightAveragingOptions().update_every_n_steps(2).update_starting_at_step(3));
  std::vector<int64_t> steps;
  for (int64_t i = 0; i < 9; ++i) {
    if (every.should_update(i, std::nullopt)) steps.push_back(i);
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{4, 6, 8}));
  EXPECT_FALSE(every.should_update(std::nullopt, 5)) << "no epoch updates unless asked";
  EMAWeightAveraging epochs(EMAWeightAveragingOptions().update_every_n_steps(0).update_starting_at_epoch(1));
  EXPECT_FALSE(epochs.should_update(0, std::nullopt));
  EXPECT_FALSE(epochs.should_update(std::nullopt, 0));
  EXPECT_TRUE(epochs.should_update(std::nullopt, 1));
  StochasticWeightAveraging swa(StochasticWeightAveragingOptions(0.1));
  EXPECT_FALSE(swa.should_update(3, std::nullopt)) << "SWA updates at epoch ends only";
}

}  // namespace
}  // namespace weight_averaging_test
}  // namespace lockstep
