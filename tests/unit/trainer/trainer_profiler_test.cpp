// --profiler pytorch on a real 2-rank job (tests/programs/trainer_program, self-launched), and
// in one process: each rank's trace holds the scheduled batches, the Trainer's actions and the
// operations inside them.
#include <algorithm>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <lockstep/core/error.h>
#include <lockstep/trainer/trainer.h>

#include "../../support/command.h"
#include "../../support/errors.h"
#include "../../support/paths.h"
#include "../../support/profiler_trace.h"
#include "../../support/regression.h"
#include "../../support/temp_dir.h"

namespace lockstep {
namespace trainer_profiler_test {

namespace fs = std::filesystem;

// Every *.pt.trace.json under `root`, sorted.
std::vector<fs::path> traces_under(const fs::path& root) {
  std::vector<fs::path> found;
  for (const auto& entry : fs::recursive_directory_iterator(root)) {
    const std::string name = entry.path().filename().string();
    if (name.size() > 14 && name.compare(name.size() - 14, 14, ".pt.trace.json") == 0) found.push_back(entry.path());
  }
  std::sort(found.begin(), found.end());
  return found;
}

// Spans whose name starts with `prefix` and ends with `suffix`.
int64_t ranges_like(const testing::ProfilerTrace& trace, const std::string& prefix, const std::string& suffix) {
  int64_t n = 0;
  for (const auto& span : trace.spans) {
    const std::string name = span["name"];
    n += name.rfind(prefix, 0) == 0 && name.size() >= suffix.size() &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  }
  return n;
}

// Each training_step span of `trace` holds the two aten::addmm of the Regressor's forward.
void expect_forwards_inside_steps(const testing::ProfilerTrace& trace, const std::string& which) {
  const auto steps = trace.named("training_step");
  const auto addmm = trace.named("aten::addmm");
  ASSERT_EQ(addmm.size(), 2 * steps.size()) << which;
  for (size_t i = 0; i < addmm.size(); ++i) {
    EXPECT_TRUE(testing::nested(addmm[i], steps[i / 2])) << which << ": " << addmm[i].dump() << " outside "
                                                          << steps[i / 2].dump();
  }
}

// Throws in the hook after training batch `batch` (0, 1, ... over all epochs).
struct FailAfterBatch : Callback {
  explicit FailAfterBatch(int64_t batch) : batch(batch) {}
  std::string name() const override { return "FailAfterBatch"; }
  void on_train_batch_end(TrainerView&, TrainingModule&, const torch::Tensor&, int64_t) override {
    if (seen++ == batch) throw std::runtime_error("fails on purpose");
  }
  int64_t batch, seen = 0;
};

}  // namespace trainer_profiler_test

namespace {

using namespace trainer_profiler_test;

// 2 epochs of 4 batches per rank: batches 3 to 5 are traced, across the epoch's end, where
// ModelCheckpoint saves.
TEST(TrainerPyTorchProfiler, TwoRanksEachWriteATraceOfBatchesThreeToFive) {
  testing::TempDir dir("trainer_profiler");
  const std::string root = dir.path() + "/runs";
  const std::vector<std::string> argv{
      std::string(LOCKSTEP_BIN_DIR) + "/../tests/trainer_program", "--out", dir.path(), "--default-root-dir", root,
      "--timeout", "60", "--devices", "2", "--strategy", "ddp", "--max-epochs", "2", "--profiler", "pytorch"};
  const auto result = testing::run_command(argv, {{"PATH", "/usr/bin:/bin"}, {"OMP_NUM_THREADS", "1"}},
                                           std::chrono::seconds(90));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const auto traces = traces_under(root);
  ASSERT_EQ(traces.size(), 2u) << result.err;
  for (int rank = 0; rank < 2; ++rank) {
    const auto& path = traces[static_cast<size_t>(rank)];
    EXPECT_EQ(path.filename(), "fit-rank_" + std::to_string(rank) + ".pt.trace.json");
    EXPECT_EQ(path.parent_path().filename(), "profiler");
    const auto trace = testing::read_profiler_trace(path, rank);
    for (const char* action : {"train_dataloader_next", "training_step", "backward", "optimizer_step"}) {
      EXPECT_EQ(trace.count(action), 3) << "rank " << rank << ": " << action;
    }
    // Epoch 1's, which began inside the trace; epoch 0's began before it.
    EXPECT_EQ(trace.count("run_training_epoch"), 1) << "rank " << rank;
    EXPECT_EQ(ranges_like(trace, "[Callback]ModelCheckpoint", ".on_train_epoch_end"), 1) << "rank " << rank;
    EXPECT_GE(trace.count("save_checkpoint"), 1) << "rank " << rank;
    expect_forwards_inside_steps(trace, "rank " + std::to_string(rank));
  }
  const std::string said = "PyTorchProfiler: traced training batches 3 to 5 into " +
                           (traces[0].parent_path() / "fit-rank_<R>.pt.trace.json").string();
  const size_t at = result.err.find(said);
  EXPECT_NE(at, std::string::npos) << result.err;
  EXPECT_EQ(result.err.find(said, at + 1), std::string::npos) << "said twice: " << result.err;
  EXPECT_NE(result.err.find("|  aten::addmm "), std::string::npos) << result.err;
}

// In one process through TrainerOptions: a fit of 4 batches ends the trace at batch 4.
TEST(TrainerPyTorchProfiler, TheOptionTracesInOneProcessUntilFitEnds) {
  testing::TempDir dir("trainer_profiler_one");
  torch::set_num_threads(1);
  Trainer trainer(TrainerOptions().max_epochs(2).num_sanity_val_steps(0).default_root_dir(dir.path())
                      .enable_progress_bar(false).enable_checkpointing(false).profiler("pytorch"));
  ::testing::internal::CaptureStderr();
  trainer.fit(std::make_shared<testing::Regressor>(),
              std::make_shared<DataLoader>(testing::regression_data(32), DataLoaderOptions(16)));
  const std::string err = ::testing::internal::GetCapturedStderr();
  const auto path = fs::path(trainer.log_dir()) / "profiler" / "fit-rank_0.pt.trace.json";
  const auto trace = testing::read_profiler_trace(path, 0);
  EXPECT_EQ(trace.count("training_step"), 2);
  EXPECT_EQ(trace.count("optimizer_step"), 2);
  expect_forwards_inside_steps(trace, "one process");
  EXPECT_NE(err.find("PyTorchProfiler: traced training batches 3 to 4"), std::string::npos) << err;
}

// A fit that an exception ends still writes the batches it traced.
TEST(TrainerPyTorchProfiler, AFitEndedByAnExceptionKeepsItsTrace) {
  testing::TempDir dir("trainer_profiler_failed");
  Trainer trainer(TrainerOptions().max_epochs(2).num_sanity_val_steps(0).default_root_dir(dir.path())
                      .enable_progress_bar(false).enable_checkpointing(false).profiler("pytorch"));
  trainer.add_callback(std::make_shared<FailAfterBatch>(3));
  ::testing::internal::CaptureStderr();
  EXPECT_THROW(trainer.fit(std::make_shared<testing::Regressor>(),
                           std::make_shared<DataLoader>(testing::regression_data(32), DataLoaderOptions(16))),
               std::runtime_error);
  ::testing::internal::GetCapturedStderr();
  const auto path = fs::path(trainer.log_dir()) / "profiler" / "fit-rank_0.pt.trace.json";
  const auto trace = testing::read_profiler_trace(path, 0);
  EXPECT_EQ(trace.count("training_step"), 2);
  EXPECT_EQ(trace.count("[Callback]FailAfterBatch.on_train_batch_end"), 2);
}

TEST(TrainerPyTorchProfiler, AnUnknownProfilerInCodeIsRefusedWithTheNames) {
  testing::TempDir dir("trainer_profiler_bad");
  Trainer trainer(TrainerOptions().max_epochs(1).default_root_dir(dir.path()).enable_progress_bar(false)
                      .profiler("advanced"));
  const auto message = testing::error_of<UsageError>([&] {
    trainer.fit(std::make_shared<testing::Regressor>(),
                std::make_shared<DataLoader>(testing::regression_data(16), DataLoaderOptions(16)));
  });
  EXPECT_EQ(message,
            "TrainerOptions::profiler is \"advanced\": use \"simple\" (or \"true\"), \"pytorch\", or \"\" (off).");
}

}  // namespace
}  // namespace lockstep
