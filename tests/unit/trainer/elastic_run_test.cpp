// What an elastic job's restarted attempts read and print (src/lockstep/trainer/elastic_run.h);
// the job itself under torchrun is ElasticHosts.* (tests/cluster).
#include "../../../src/lockstep/trainer/elastic_run.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "../../support/temp_dir.h"

namespace lockstep {
namespace elastic_run_test {
namespace {

using testing::TempDir;
namespace fs = std::filesystem;

// 64 examples, batch 8: 2 ranks take 4 batches an epoch, 3 ranks 3. After 3 batches at 2 ranks
// (48 examples of the epoch's order), 3 ranks go on from their batch 2 (examples 48-71).
TEST(ElasticRun, AMidEpochPositionMovesToTheBatchOfTheNewWorldThatHoldsIt) {
  EXPECT_EQ(detail::next_batch_at(3, 2, 4, 3, 3), 2);
  EXPECT_EQ(detail::next_batch_at(2, 3, 3, 2, 4), 3);  // 48 examples: 3 batches of 16
  EXPECT_EQ(detail::next_batch_at(1, 3, 3, 2, 4), 1);  // 24: batch 1 of 2 ranks starts at 16
  EXPECT_EQ(detail::next_batch_at(5, 2, 8, 2, 8), 5);
  EXPECT_EQ(detail::next_batch_at(0, 3, 3, 2, 4), 0);
  // After the epoch's last batch the epoch is over at any size.
  EXPECT_EQ(detail::next_batch_at(4, 2, 4, 3, 3), 3);
  EXPECT_EQ(detail::next_batch_at(3, 3, 3, 2, 4), 4);
}

TEST(ElasticRun, TheAttemptRecordIsReadBackAndRewrittenInPlace) {
  TempDir dir("elastic_run");
  EXPECT_FALSE(detail::read_attempt_progress(dir.path()).has_value());
  {
    detail::AttemptRecord record(dir.path(), 3, 0);
    for (int64_t step = 1; step <= 1200; ++step) record.at_step(step);
  }
  auto progress = detail::read_attempt_progress(dir.path());
  ASSERT_TRUE(progress.has_value());
  EXPECT_EQ(progress->world_size, 3);
  EXPECT_EQ(progress->global_step, 1200);
  // One line of 64 bytes rewritten in place, then the run id (none here).
  EXPECT_EQ(fs::file_size(dir / "progress.txt"), 64u + std::string("run_id \n").size());
  detail::AttemptRecord next(dir.path(), 2, 7);
  progress = detail::read_attempt_progress(dir.path());
  EXPECT_EQ(progress->world_size, 2);
  EXPECT_EQ(progress->global_step, 7);
}

TEST(ElasticRun, TheMembershipLineSaysTheSizesTheCheckpointAndTheStepsLost) {
  EXPECT_EQ(detail::membership_line({3, 17}, 2, "runs/v/checkpoints/last.ckpt", 14),
            "lockstep: membership changed: world size 3 -> 2; resumed runs/v/checkpoints/last.ckpt (step 14); 3 "
            "step(s) lost since it (steps 15-17 of the last attempt).\n");
  EXPECT_EQ(detail::membership_line({2, 25}, 3, "last.ckpt", 25),
            "lockstep: membership changed: world size 2 -> 3; resumed last.ckpt (step 25); 0 step(s) lost since it.\n");
  EXPECT_EQ(detail::membership_line({2, 4}, 2, "", 0),
            "lockstep: the job restarted at the same world size 2; no checkpoint yet, training from the start; 4 "
            "step(s) lost since it (steps 1-4 of the last attempt).\n");
}

TEST(ElasticRun, TheRunWithTheNewestLastCheckpointIsTheOneContinued) {
  TempDir dir("elastic_run");
  EXPECT_FALSE(detail::version_with_last_checkpoint(dir.path()).has_value());
  for (const char* version : {"version_0", "version_2", "version_10", "version_x"}) {
    fs::create_directories(fs::path(dir.path()) / version / "checkpoints");
  }
  std::ofstream(dir / "version_0/checkpoints/last.ckpt") << "0";
  std::ofstream(dir / "version_2/checkpoints/last.ckpt") << "2";
  EXPECT_EQ(detail::version_with_last_checkpoint(dir.path()), 2);  // version_10 saved none
}

// Only the job that made a run folder continues it: a new job (a new run id, as every
// self-launch and `lockstep launch` has) resuming from its last.ckpt writes a folder of its own.
TEST(ElasticRun, OnlyTheJobThatMadeTheFolderContinuesIt) {
  TempDir dir("elastic_run");
  ::setenv("TORCHELASTIC_RUN_ID", "job-a", 1);
  { detail::AttemptRecord record(dir.path(), 2, 5); }
  EXPECT_TRUE(detail::made_by_this_job(dir.path()));
  EXPECT_EQ(detail::read_attempt_progress(dir.path())->global_step, 5);
  ::setenv("TORCHELASTIC_RUN_ID", "job-b", 1);
  EXPECT_FALSE(detail::made_by_this_job(dir.path()));
  ::unsetenv("TORCHELASTIC_RUN_ID");
  EXPECT_FALSE(detail::made_by_this_job(dir.path()));
  EXPECT_FALSE(detail::made_by_this_job(dir.path() + "/none"));
}

}  // namespace
}  // namespace elastic_run_test
}  // namespace lockstep
