#include <lockstep/core/error.h>
#include <lockstep/loggers/csv_logger.h>

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <system_error>

#include "../../support/temp_dir.h"

namespace lockstep {
namespace loggers {
namespace {

namespace fs = std::filesystem;

using TempDir = lockstep::testing::TempDir;

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

TEST(CSVLoggerTest, WritesHeaderAndRowsAndWidensTheHeaderForNewMetrics) {
  TempDir root{"lockstep_csv"};
  CSVLogger logger(LoggerOptions(root.path()));
  logger.log_metrics({{"train_loss", 0.5}, {"epoch", 0}}, 0);
  logger.log_metrics({{"train_loss", 0.25}, {"epoch", 0}}, 1);
  EXPECT_EQ(slurp(root / "lockstep_logs/version_0/metrics.csv"), "step,epoch,train_loss\n0,0,0.5\n1,0,0.25\n");
  logger.log_metrics({{"val_loss", 0.75}, {"val_acc", 0.875}, {"epoch", 0}}, 1);
  logger.log_metrics({{"train_loss", 0.125}, {"epoch", 1}}, 2);
  EXPECT_EQ(slurp(logger.metrics_file()),
            "step,epoch,train_loss,val_acc,val_loss\n"
            "0,0,0.5,,\n"
            "1,0,0.25,,\n"
            "1,0,,0.875,0.75\n"
            "2,1,0.125,,\n");
  EXPECT_EQ(logger.metrics_file(), root / "lockstep_logs/version_0/metrics.csv");
  EXPECT_EQ(logger.log_dir(), root / "lockstep_logs/version_0");
  EXPECT_EQ(logger.version(), "version_0");
  EXPECT_EQ(logger.name(), "lockstep_logs");
  EXPECT_EQ(logger.save_dir(), root.path());
  for (const auto& entry : fs::directory_iterator(logger.log_dir())) {
    EXPECT_EQ(entry.path().filename().string().find(".tmp."), std::string::npos) << entry.path();
  }
}

TEST(CSVLoggerTest, EpochLoggedLaterMovesToTheSecondColumn) {
  TempDir root{"lockstep_csv"};
  CSVLogger logger(LoggerOptions(root.path()).name(""));
  logger.log_metrics({{"loss", 1}}, 0);
  logger.log_metrics({{"loss", 2}, {"epoch", 3}}, 1);
  EXPECT_EQ(slurp(root / "version_0/metrics.csv"), "step,epoch,loss\n0,,1\n1,3,2\n");
}

TEST(CSVLoggerTest, ValuesReadBackAsTheSameDouble) {
  TempDir root{"lockstep_csv"};
  CSVLogger logger(LoggerOptions(root.path()));
  logger.log_metrics({{"a", 0.1}, {"b", 1e-10}, {"c", 123456789.125}, {"d", std::nan("")},
                      {"e", -std::numeric_limits<double>::infinity()}, {"f", 1.0 / 3.0}},
                     int64_t{1} << 40);
  EXPECT_EQ(slurp(logger.metrics_file()),
            "step,a,b,c,d,e,f\n1099511627776,0.1,1e-10,123456789.125,nan,-inf,0.3333333333333333\n");
}

TEST(CSVLoggerTest, MetricNamesWithCommasAreQuoted) {
  TempDir root{"lockstep_csv"};
  CSVLogger logger(LoggerOptions(root.path()));
  logger.log_metrics({{"acc,top1", 0.5}}, 0);
  logger.log_metrics({{"say \"hi\"", 1}}, 1);
  EXPECT_EQ(slurp(logger.metrics_file()), "step,\"acc,top1\",\"say \"\"hi\"\"\"\n0,0.5,\n1,,1\n");
}

TEST(CSVLoggerTest, NextVersionIsOneMoreThanTheHighest) {
  TempDir root{"lockstep_csv"};
  fs::create_directories(root / "lockstep_logs/version_0");
  {
    CSVLogger logger(LoggerOptions(root.path()));
    EXPECT_EQ(logger.version(), "version_1");
    EXPECT_TRUE(fs::is_directory(root / "lockstep_logs/version_1"));  // claimed at once
  }
  fs::create_directories(root / "lockstep_logs/version_7");
  fs::create_directories(root / "lockstep_logs/version_x");
  std::ofstream(root / "lockstep_logs/version_20") << "a file, not a version";
  CSVLogger logger(LoggerOptions(root.path()));
  EXPECT_EQ(logger.version(), "version_8");
  CSVLogger second(LoggerOptions(root.path()));
  EXPECT_EQ(second.version(), "version_9");
}

TEST(CSVLoggerTest, ExplicitVersionAppendsToItsFile) {
  TempDir root{"lockstep_csv"};
  {
    CSVLogger first(LoggerOptions(root.path()).name("exp").version(3));
    first.log_metrics({{"loss", 1}, {"epoch", 0}}, 0);
  }
  CSVLogger resumed(LoggerOptions(root.path()).name("exp").version(3));
  resumed.log_metrics({{"loss", 0.5}, {"epoch", 1}}, 10);
  resumed.log_metrics({{"acc", 0.75}}, 11);
  EXPECT_EQ(slurp(root / "exp/version_3/metrics.csv"), "step,epoch,loss,acc\n0,0,1,\n10,1,0.5,\n11,,,0.75\n");
}

TEST(CSVLoggerTest, HyperparametersAreMergedIntoHparamsYaml) {
  TempDir root{"lockstep_csv"};
  CSVLogger logger(LoggerOptions(root.path()));
  logger.log_hyperparams({{"lr", 0.001},
                          {"batch_size", 64},
                          {"optimizer", "adam"},
                          {"run name", "my run"},
                          {"betas", {0.9, 0.999}},
                          {"nested", {{"a", 1}, {"b", "yes"}}},
                          {"eps", 1e-08},
                          {"flag", true},
                          {"none", nullptr},
                          {"empty", nlohmann::json::array()}});
  EXPECT_EQ(slurp(logger.log_dir() + "/hparams.yaml"),
            "batch_size: 64\n"
            "betas:\n"
            "- 0.9\n"
            "- 0.999\n"
            "empty: []\n"
            "eps: 1.0e-08\n"
            "flag: true\n"
            "lr: 0.001\n"
            "nested:\n"
            "  a: 1\n"
            "  b: \"yes\"\n"
            "none: null\n"
            "optimizer: adam\n"
            "\"run name\": \"my run\"\n");
  logger.log_hyperparams({{"lr", 0.01}, {"seed", 42}});
  const std::string yaml = slurp(logger.log_dir() + "/hparams.yaml");
  EXPECT_NE(yaml.find("lr: 0.01\n"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("seed: 42\n"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("optimizer: adam\n"), std::string::npos) << yaml;
}

TEST(CSVLoggerTest, HyperparametersMustBeAnObject) {
  TempDir root{"lockstep_csv"};
  CSVLogger logger(LoggerOptions(root.path()));
  EXPECT_THROW(logger.log_hyperparams(nlohmann::json::array({1, 2})), UsageError);
}

TEST(CSVLoggerTest, UnwritableRootIsAUsageErrorNamingIt) {
  TempDir root{"lockstep_csv"};
  std::ofstream(root / "file") << "x";
  CSVLogger logger(LoggerOptions(root / "file/logs"));
  try {
    logger.log_metrics({{"loss", 1}}, 0);
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(root / "file/logs"), std::string::npos) << message;
    EXPECT_NE(message.find("--default-root-dir"), std::string::npos) << message;
  }
}

// The run's folder vanished under the logger (a clean-up job, a wiped scratch disk): the next row
// is an IoError naming the file and the OS's reason, which ends a program with exit code 1.
TEST(CSVLoggerTest, AVanishedFolderIsAnIoErrorNamingTheFile) {
  TempDir root{"lockstep_csv"};
  CSVLogger logger(LoggerOptions(root.path()));
  logger.log_metrics({{"loss", 1}}, 0);
  fs::remove_all(logger.log_dir());
  try {
    logger.log_metrics({{"loss", 2}}, 1);
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_EQ(e.path(), logger.metrics_file());
    EXPECT_EQ(e.code(), std::errc::no_such_file_or_directory);
    EXPECT_EQ(e.exit_code(), 1);
    const std::string message = e.what();
    EXPECT_EQ(message.rfind("appending a row to the metrics file '" + logger.metrics_file() + "' failed: " +
                                e.code().message() + ". Check that its folder exists and is writable",
                            0),
              0u)
        << message;
  }
  // A new column rewrites the file through a temporary one beside it.
  try {
    logger.log_metrics({{"acc", 1}}, 2);
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_EQ(e.path().rfind(logger.metrics_file() + ".tmp.", 0), 0u) << e.path();
    EXPECT_NE(std::string(e.what()).find(e.path()), std::string::npos) << e.what();
  }
  EXPECT_THROW(logger.log_hyperparams({{"lr", 0.1}}), IoError);
}

TEST(CSVLoggerTest, AReadOnlyFolderIsAnIoErrorNamingTheFile) {
  if (::geteuid() == 0) GTEST_SKIP() << "root writes through permissions";
  TempDir root{"lockstep_csv"};
  CSVLogger logger(LoggerOptions(root.path()));
  logger.log_metrics({{"loss", 1}}, 0);
  fs::permissions(logger.log_dir(), fs::perms::owner_read | fs::perms::owner_exec);
  try {
    logger.log_metrics({{"acc", 1}}, 1);
    ADD_FAILURE() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_EQ(e.code(), std::errc::permission_denied) << e.what();
    EXPECT_NE(std::string(e.what()).find(logger.log_dir()), std::string::npos) << e.what();
  }
  fs::permissions(logger.log_dir(), fs::perms::owner_all);
}

}  // namespace
}  // namespace loggers
}  // namespace lockstep
