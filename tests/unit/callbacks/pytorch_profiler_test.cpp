// PyTorchProfiler driven by scopes as the Trainer opens them, without a Trainer: its schedule,
// the trace it writes and what it prints.
#include <lockstep/callbacks/pytorch_profiler.h>

#include <filesystem>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <lockstep/core/error.h>

#include "../../support/profiler_trace.h"
#include "../../support/temp_dir.h"

namespace lockstep {
namespace pytorch_profiler_test {

// `batches` training batches as the Trainer runs them: load, a Linear's forward, backward.
void train(Profiler& profiler, int batches) {
  torch::manual_seed(0);
  torch::nn::Linear linear(4, 2);
  for (int i = 0; i < batches; ++i) {
    auto batch = [&] {
      auto fetch = profiler.scope("train_dataloader_next");
      return torch::randn({8, 4});
    }();
    torch::Tensor loss;
    {
      auto step = profiler.scope("training_step");
      loss = linear(batch).pow(2).mean();
    }
    auto backward = profiler.scope("backward");
    loss.backward();
  }
}

}  // namespace pytorch_profiler_test

namespace {

using namespace pytorch_profiler_test;
namespace fs = std::filesystem;

TEST(PyTorchProfilerTest, TracesTheScheduledBatchesWithTheirOperationsInside) {
  testing::TempDir dir("pytorch_profiler");
  torch::set_num_threads(1);
  PyTorchProfiler profiler(PyTorchProfilerOptions().wait(1).active(2));
  profiler.setup("fit", 3, dir.path());
  train(profiler, 5);
  profiler.teardown("fit");
  const auto path = fs::path(dir.path()) / "profiler" / "fit-rank_3.pt.trace.json";
  EXPECT_EQ(profiler.trace_path(), path.string());
  const auto trace = testing::read_profiler_trace(path, 3);
  EXPECT_EQ(trace.json["distributedInfo"]["rank"], 3);
  // Batches 2 and 3 of 5: each action twice, each forward's aten::addmm inside its training_step.
  for (const char* action : {"train_dataloader_next", "training_step", "backward"}) {
    EXPECT_EQ(trace.count(action), 2) << action;
    for (const auto& span : trace.named(action)) EXPECT_EQ(span["cat"], "user_annotation") << span.dump();
  }
  const auto steps = trace.named("training_step");
  const auto addmm = trace.named("aten::addmm");
  ASSERT_EQ(addmm.size(), 2u);
  for (size_t i = 0; i < addmm.size(); ++i) {
    EXPECT_EQ(addmm[i]["cat"], "cpu_op");
    EXPECT_TRUE(testing::nested(addmm[i], steps[i])) << addmm[i].dump() << " outside " << steps[i].dump();
  }
  EXPECT_GT(trace.count("autograd::engine::evaluate_function: AddmmBackward0"), 0);
  const std::string summary = profiler.summary();
  EXPECT_NE(summary.find("traced training batches 2 to 3 into " + (fs::path(dir.path()) / "profiler").string() +
                         "/fit-rank_<R>.pt.trace.json"),
            std::string::npos)
      << summary;
  EXPECT_NE(summary.find("|  aten::addmm "), std::string::npos) << summary;
}

TEST(PyTorchProfilerTest, ARunShorterThanTheScheduleTracesWhatRan) {
  testing::TempDir dir("pytorch_profiler_short");
  PyTorchProfiler profiler(PyTorchProfilerOptions().wait(0).active(5).dirpath(dir.path() + "/traces").row_limit(0));
  profiler.setup("fit", 0, "unused");
  train(profiler, 2);
  profiler.teardown("fit");
  const auto trace = testing::read_profiler_trace(fs::path(dir.path()) / "traces" / "fit-rank_0.pt.trace.json", 0);
  EXPECT_EQ(trace.count("training_step"), 2);
  const std::string summary = profiler.summary();
  EXPECT_NE(summary.find("traced training batches 1 to 2"), std::string::npos) << summary;
  EXPECT_EQ(summary.find("Self CPU"), std::string::npos) << summary;  // row_limit 0: no table

  PyTorchProfiler late(PyTorchProfilerOptions().wait(3).dirpath(dir.path() + "/late"));
  late.setup("fit", 0, "unused");
  train(late, 2);
  late.teardown("fit");
  EXPECT_FALSE(fs::exists(fs::path(dir.path()) / "late"));
  EXPECT_EQ(late.summary(),
            "PyTorchProfiler: no trace: fit ran 2 training batches, and the trace begins at batch 4. Lower "
            "PyTorchProfilerOptions::wait (3).\n");
}

TEST(PyTorchProfilerTest, BadOptionsAreRefusedWithTheFix) {
  const auto message = [](const PyTorchProfilerOptions& options) {
    try {
      PyTorchProfiler profiler(options);
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(message(PyTorchProfilerOptions().wait(-1)),
            "PyTorchProfilerOptions::wait is -1: use 0 or more (the training batches before the trace).");
  EXPECT_EQ(message(PyTorchProfilerOptions().active(0)),
            "PyTorchProfilerOptions::active is 0: use 1 or more (the training batches traced); to trace nothing, "
            "set no profiler.");
  EXPECT_EQ(message(PyTorchProfilerOptions().row_limit(-2)),
            "PyTorchProfilerOptions::row_limit is -2: use 0 or more (0 prints no table).");
}

}  // namespace
}  // namespace lockstep
