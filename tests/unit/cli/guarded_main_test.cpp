// Every Lockstep error class is a lockstep::Error of its kind, and guarded_main ends a program
// with the kind's exit code and one "PROGRAM: error: ..." line.
#include <lockstep/cli/guarded_main.h>

#include <cerrno>
#include <filesystem>
#include <functional>
#include <stdexcept>
#include <string>
#include <system_error>

#include <gtest/gtest.h>

#include <lockstep/accelerators/device_busy_error.h>
#include <lockstep/core/error.h>
#include <lockstep/distributed/distributed_error.h>
#include <lockstep/environments/environment_error.h>
#include <lockstep/launchers/launch_error.h>
#include <lockstep/loggers/csv_logger.h>

#include "../../support/temp_dir.h"

namespace lockstep {
namespace {

struct Ended {
  int code;
  std::string stderr_text;
};

Ended run(const std::function<int()>& body) {
  ::testing::internal::CaptureStderr();
  const int code = cli::guarded_main("prog", body);
  return {code, ::testing::internal::GetCapturedStderr()};
}

template <typename E>
Ended throwing(const std::string& message) {
  return run([&]() -> int { throw E(message); });
}

TEST(GuardedMain, EachErrorClassEndsWithItsKindsCode) {
  EXPECT_EQ(throwing<UsageError>("u").code, 2);
  EXPECT_EQ(throwing<environments::EnvironmentError>("e").code, 2);
  EXPECT_EQ(throwing<launchers::LaunchError>("l").code, 2);
  EXPECT_EQ(throwing<accelerators::DeviceBusyError>("b").code, 2);
  EXPECT_EQ(throwing<distributed::DistributedError>("d").code, 1);
  EXPECT_EQ(run([]() -> int { throw IoError("writing", "/full/disk/metrics.csv", ENOSPC); }).code, 1);
  EXPECT_EQ(throwing<std::runtime_error>("r").code, 1) << "anything else is a failure, not bad input";
  EXPECT_EQ(run([] { return 0; }).code, 0);
  EXPECT_EQ(run([] { return 3; }).code, 3);
}

TEST(GuardedMain, PrintsOneLineNamingTheProgram) {
  EXPECT_EQ(throwing<environments::EnvironmentError>("RANK=4 is not below WORLD_SIZE=4").stderr_text,
            "prog: error: RANK=4 is not below WORLD_SIZE=4\n");
}

TEST(GuardedMain, AnIoErrorPrintsThePathTheReasonAndTheFix) {
  const Ended ended = run([]() -> int { throw IoError("appending a row to the metrics file", "m.csv", EACCES); });
  EXPECT_EQ(ended.code, 1);
  EXPECT_EQ(ended.stderr_text, "prog: error: appending a row to the metrics file 'm.csv' failed: " +
                                   std::generic_category().message(EACCES) + ". " + IoError::kCheckFolder + "\n");
}

TEST(GuardedMain, ALoggerThatCannotWriteEndsTheProgramWithCode1NamingTheFile) {
  testing::TempDir root{"lockstep_guarded"};
  loggers::CSVLogger logger(loggers::LoggerOptions(root.path()));
  logger.log_metrics({{"loss", 1}}, 0);
  std::filesystem::remove_all(logger.log_dir());
  const Ended ended = run([&] {
    logger.log_metrics({{"loss", 2}}, 1);
    return 0;
  });
  EXPECT_EQ(ended.code, 1);
  EXPECT_EQ(ended.stderr_text.rfind("prog: error: appending a row to the metrics file '" + logger.metrics_file() +
                                        "' failed: " + std::generic_category().message(ENOENT) + ". ",
                                    0),
            0u)
      << ended.stderr_text;
}

TEST(GuardedMain, EveryClassIsALockstepErrorOfItsKind) {
  auto kind_of = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return e.kind();
    }
    throw std::logic_error("no lockstep::Error");
  };
  EXPECT_EQ(kind_of([] { throw environments::EnvironmentError("x"); }), ErrorKind::environment);
  EXPECT_EQ(kind_of([] { throw launchers::LaunchError("x"); }), ErrorKind::launch);
  EXPECT_EQ(kind_of([] { throw distributed::DistributedError("x"); }), ErrorKind::distributed);
  EXPECT_EQ(kind_of([] { throw distributed::UnusedParametersError("x", {"w"}); }), ErrorKind::distributed);
  EXPECT_EQ(kind_of([] { throw accelerators::DeviceBusyError("x"); }), ErrorKind::environment);
  EXPECT_EQ(kind_of([] { throw IoError("writing", "f", EIO); }), ErrorKind::io);
}

}  // namespace
}  // namespace lockstep
