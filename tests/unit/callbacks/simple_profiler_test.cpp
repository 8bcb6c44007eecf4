#include <lockstep/callbacks/simple_profiler.h>

#include <sstream>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace lockstep {
namespace {

void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

TEST(SimpleProfilerTest, ScopesRecordCallsAndDurations) {
  SimpleProfiler profiler;
  for (int i = 0; i < 3; ++i) {
    auto timed = profiler.scope("training_step");
    sleep_ms(10);
  }
  {
    auto timed = profiler.scope("validation");
    sleep_ms(40);
    timed.stop();  // recorded here; the destructor adds nothing
    sleep_ms(30);
  }
  const auto stats = profiler.stats();
  ASSERT_EQ(stats.size(), 2u);
  const auto& step = stats.at("training_step");
  EXPECT_EQ(step.calls, 3);
  EXPECT_GE(step.min_seconds, 0.010);
  EXPECT_LT(step.max_seconds, 0.5);
  EXPECT_NEAR(step.mean_seconds(), step.total_seconds / 3, 1e-12);
  const auto& validation = stats.at("validation");
  EXPECT_EQ(validation.calls, 1);
  EXPECT_GE(validation.total_seconds, 0.040);
  EXPECT_LT(validation.total_seconds, 0.070);
  EXPECT_GE(profiler.elapsed_seconds(), 0.100);
}

TEST(SimpleProfilerTest, NullProfilerScopesDoNothingAndMovedScopesRecordOnce) {
  { Profiler::Scope off(nullptr, "backward"); }
  SimpleProfiler profiler;
  {
    Profiler::Scope first(&profiler, "backward");
    Profiler::Scope moved(std::move(first));
  }
  EXPECT_EQ(profiler.stats().at("backward").calls, 1);
  profiler.record("optimizer_step", 0.25);
  profiler.record("optimizer_step", 0.75);
  EXPECT_DOUBLE_EQ(profiler.stats().at("optimizer_step").min_seconds, 0.25);
  EXPECT_DOUBLE_EQ(profiler.stats().at("optimizer_step").max_seconds, 0.75);
  profiler.reset();
  EXPECT_TRUE(profiler.stats().empty());
}

TEST(SimpleProfilerTest, SummaryIsATableSortedByTotalTime) {
  SimpleProfiler profiler("FIT");
  profiler.record("training_step", 0.5);
  profiler.record("training_step", 0.5);
  profiler.record("[Callback]ModelCheckpoint.on_train_epoch_end", 2.0);
  profiler.record("backward", 0.25);
  const std::string report = profiler.summary();
  std::istringstream in(report);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 10u) << report;
  EXPECT_EQ(lines[0], "FIT Profiler Report");
  const std::string name_column(std::string("[Callback]ModelCheckpoint.on_train_epoch_end").size(), ' ');
  EXPECT_EQ(lines[2], "|  Action" + name_column.substr(6) +
                          "  |  Mean duration (s)  |  Num calls  |  Total time (s)  |  Percentage %  |");
  EXPECT_EQ(lines[1], std::string(lines[2].size(), '-'));
  EXPECT_EQ(lines[4].rfind("|  Total ", 0), 0u);
  EXPECT_NE(lines[4].find("|  4          |"), std::string::npos) << lines[4];
  EXPECT_EQ(lines[6].rfind("|  [Callback]ModelCheckpoint.on_train_epoch_end  |  2                  |  1          |  2    ", 0), 0u)
      << lines[6];
  EXPECT_EQ(lines[7].rfind("|  training_step", 0), 0u) << lines[7];
  EXPECT_NE(lines[7].find("|  0.5                |  2          |  1    "), std::string::npos) << lines[7];
  EXPECT_EQ(lines[8].rfind("|  backward", 0), 0u) << lines[8];
  EXPECT_EQ(lines[9], lines[1]);
}

}  // namespace
}  // namespace lockstep
