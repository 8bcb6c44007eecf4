#include <lockstep/core/error.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cerrno>
#include <system_error>

namespace lockstep {
namespace {

TEST(Error, TheKindDecidesTheExitCode) {
  EXPECT_EQ(Error(ErrorKind::usage, "x").exit_code(), 2);
  EXPECT_EQ(Error(ErrorKind::environment, "x").exit_code(), 2);
  EXPECT_EQ(Error(ErrorKind::launch, "x").exit_code(), 2);
  EXPECT_EQ(Error(ErrorKind::distributed, "x").exit_code(), 1);
  EXPECT_EQ(Error(ErrorKind::training, "x").exit_code(), 1);
  EXPECT_EQ(Error(ErrorKind::io, "x").exit_code(), 1);
  const UsageError usage("bad");
  EXPECT_EQ(usage.kind(), ErrorKind::usage);
  EXPECT_STREQ(usage.what(), "bad");
}

TEST(Error, AnIoErrorNamesWhatFailedThePathTheReasonAndTheFix) {
  const IoError error("appending a row to the metrics file", "runs/version_0/metrics.csv", ENOSPC);
  EXPECT_EQ(error.kind(), ErrorKind::io);
  EXPECT_EQ(error.exit_code(), 1);
  EXPECT_EQ(error.path(), "runs/version_0/metrics.csv");
  EXPECT_EQ(error.code(), std::errc::no_space_on_device);
  EXPECT_EQ(std::string(error.what()),
            "appending a row to the metrics file 'runs/version_0/metrics.csv' failed: " +
                std::generic_category().message(ENOSPC) + ". " + IoError::kCheckFolder);
  const IoError unset("writing", "f", 0, "Fix it.");
  EXPECT_EQ(unset.code(), std::errc::io_error) << "a stream that failed without an errno";
  EXPECT_EQ(std::string(unset.what()), "writing 'f' failed: " + std::generic_category().message(EIO) + ". Fix it.");
}

TEST(Error, CheckThrowsTheGivenClassWithTheJoinedMessageOnlyWhenTheConditionFails) {
  const int n = 0;
  try {
    LOCKSTEP_CHECK(n >= 1, UsageError, "n is ", n, "; use ", 1, " or more.");
    ADD_FAILURE() << "no throw";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "n is 0; use 1 or more.");
  }
  int evaluated = 0;
  EXPECT_NO_THROW(LOCKSTEP_CHECK(++evaluated == 1, UsageError, "never"));
  EXPECT_EQ(evaluated, 1) << "the condition runs once";
  // One statement: safe in an unbraced if/else.
  if (n == 0) LOCKSTEP_CHECK(true, UsageError, "x"); else ADD_FAILURE();
}

// LibTorch's errors may carry a C++ backtrace in what() (2.x does); ours quote them without it.
TEST(Error, MessageOfDropsLibTorchsBacktrace) {
  const c10::Error made(c10::SourceLocation{"f", "file.cpp", 1}, "shape '[3]' is invalid");
  EXPECT_EQ(message_of(made).rfind("shape '[3]' is invalid", 0), 0u) << message_of(made);
  EXPECT_EQ(message_of(made).find("frame #"), std::string::npos) << message_of(made);
  try {
    torch::ones({2}).view({3});
    ADD_FAILURE() << "no throw";
  } catch (const std::exception& e) {
    const std::string message = message_of(e);
    EXPECT_NE(message.find("shape '[3]' is invalid"), std::string::npos) << message;
    EXPECT_EQ(message.find("frame #"), std::string::npos) << message;
  }
  EXPECT_EQ(message_of(std::runtime_error("plain")), "plain");
}

}  // namespace
}  // namespace lockstep
