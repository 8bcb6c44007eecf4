#include <lockstep/loggers/tensorboard_logger.h>

#include <lockstep/core/error.h>
#include <lockstep/loggers/csv_logger.h>
#include <lockstep/trainer/trainer.h>

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <sstream>
#include <tuple>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <system_error>

// The event file is decoded here without any of the logger's code: a bitwise CRC32C, the TFRecord
// framing and the protobuf wire format, each written from their specifications.

#include "../../support/regression.h"
#include "../../support/temp_dir.h"
#include "../../support/trainer_runs.h"

namespace lockstep {
namespace loggers {
namespace {

namespace fs = std::filesystem;

using TempDir = lockstep::testing::TempDir;

// CRC-32C one bit at a time (RFC 3720, B.4): no table to share a mistake with the logger's.
uint32_t crc32c(const std::string& bytes) {
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char byte : bytes) {
    crc ^= byte;
    for (int bit = 0; bit < 8; ++bit) crc = (crc & 1u) ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
  }
  return ~crc;
}

uint32_t masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

uint64_t little_endian(const std::string& bytes, size_t at, int width) {
  uint64_t value = 0;
  for (int i = width - 1; i >= 0; --i) value = (value << 8) | static_cast<unsigned char>(bytes.at(at + i));
  return value;
}

TEST(Crc32cTest, KnownVectors) {
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);   // RFC 3720 B.4
  EXPECT_EQ(crc32c(std::string(32, '\xFF')), 0x62A8AB43u);  // RFC 3720 B.4
  std::string ascending;
  for (int i = 0; i < 32; ++i) ascending += static_cast<char>(i);
  EXPECT_EQ(crc32c(ascending), 0x46DD794Eu);  // RFC 3720 B.4
}

// TFRecords: uint64 length, masked CRC32C of the length, data, masked CRC32C of the data.
std::vector<std::string> read_records(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> records;
  size_t at = 0;
  while (at < file.size()) {
    EXPECT_LE(at + 12, file.size()) << "record header cut at byte " << at;
    if (at + 12 > file.size()) break;
    const uint64_t length = little_endian(file, at, 8);
    EXPECT_EQ(little_endian(file, at + 8, 4), masked(crc32c(file.substr(at, 8)))) << "length CRC at byte " << at;
    EXPECT_LE(at + 12 + length + 4, file.size()) << "record cut at byte " << at;
    if (at + 12 + length + 4 > file.size()) break;
    const std::string data = file.substr(at + 12, length);
    EXPECT_EQ(little_endian(file, at + 12 + length, 4), masked(crc32c(data))) << "data CRC at byte " << at;
    records.push_back(data);
    at += 12 + length + 4;
  }
  return records;
}

struct Field {
  uint32_t number;
  uint32_t wire_type;
  uint64_t integer;    // varint, fixed64 and fixed32 values
  std::string bytes;   // length-delimited values
};

uint64_t read_varint(const std::string& s, size_t& at) {
  uint64_t value = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    const auto byte = static_cast<unsigned char>(s.at(at++));
    value |= uint64_t{byte & 0x7Fu} << shift;
    if ((byte & 0x80) == 0) return value;
  }
  ADD_FAILURE() << "varint longer than 10 bytes";
  return value;
}

std::vector<Field> decode(const std::string& message) {
  std::vector<Field> fields;
  size_t at = 0;
  while (at < message.size()) {
    const uint64_t key = read_varint(message, at);
    Field field{static_cast<uint32_t>(key >> 3), static_cast<uint32_t>(key & 7), 0, {}};
    switch (field.wire_type) {
      case 0: field.integer = read_varint(message, at); break;
      case 1: field.integer = little_endian(message, at, 8); at += 8; break;
      case 5: field.integer = little_endian(message, at, 4); at += 4; break;
      case 2: {
        const uint64_t length = read_varint(message, at);
        field.bytes = message.substr(at, length);
        at += length;
        break;
      }
      default: ADD_FAILURE() << "unexpected wire type " << field.wire_type; return fields;
    }
    fields.push_back(field);
  }
  return fields;
}

struct Event {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;
  std::vector<std::pair<std::string, float>> values;
};

// event.proto: wall_time = 1 (double), step = 2 (int64), file_version = 3, summary = 5;
// summary.proto: Summary.value = 1; Value.tag = 1, Value.simple_value = 2 (float).
Event parse_event(const std::string& record) {
  Event event;
  for (const auto& field : decode(record)) {
    if (field.number == 1 && field.wire_type == 1) std::memcpy(&event.wall_time, &field.integer, 8);
    else if (field.number == 2 && field.wire_type == 0) event.step = static_cast<int64_t>(field.integer);
    else if (field.number == 3 && field.wire_type == 2) event.file_version = field.bytes;
    else if (field.number == 5 && field.wire_type == 2) {
      for (const auto& value : decode(field.bytes)) {
        EXPECT_EQ(value.number, 1u);
        std::pair<std::string, float> entry;
        for (const auto& part : decode(value.bytes)) {
          if (part.number == 1 && part.wire_type == 2) entry.first = part.bytes;
          if (part.number == 2 && part.wire_type == 5) {
            const auto bits = static_cast<uint32_t>(part.integer);
            std::memcpy(&entry.second, &bits, 4);
          }
        }
        event.values.push_back(entry);
      }
    } else {
      ADD_FAILURE() << "unexpected Event field " << field.number;
    }
  }
  return event;
}

std::vector<std::string> event_files(const std::string& dir) {
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().filename().string().rfind("events.out.tfevents.", 0) == 0) files.push_back(entry.path().string());
  }
  return files;
}

double now() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

TEST(TensorBoardLoggerTest, EventFileDecodesToTheLoggedScalars) {
  TempDir root{"lockstep_tb"};
  TensorBoardLogger logger(LoggerOptions(root.path()).name("tb"));
  logger.log_metrics({{"train_loss", 0.5}, {"epoch", 0}}, 0);
  logger.log_metrics({{"train_loss", 0.25}}, 50);
  logger.log_metrics({{"val_acc", 0.875}, {"val_loss", 1.0 / 3.0}}, int64_t{1} << 40);
  logger.finalize("success");

  EXPECT_EQ(logger.log_dir(), root.path() + "/tb/version_0");
  const auto files = event_files(logger.log_dir());
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(files[0], logger.event_file());
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  const std::string name = fs::path(files[0]).filename().string();
  EXPECT_NE(name.find("." + std::string(host) + "."), std::string::npos) << name;

  const auto records = read_records(files[0]);
  ASSERT_EQ(records.size(), 4u);
  const Event header = parse_event(records[0]);
  EXPECT_EQ(header.file_version, "brain.Event:2");
  EXPECT_NEAR(header.wall_time, now(), 60.0);
  EXPECT_EQ(name.substr(0, 20 + 10), "events.out.tfevents." + std::to_string(static_cast<int64_t>(header.wall_time)));

  const Event first = parse_event(records[1]);
  EXPECT_EQ(first.step, 0);
  EXPECT_NEAR(first.wall_time, now(), 60.0);
  EXPECT_EQ(first.values, (std::vector<std::pair<std::string, float>>{{"epoch", 0.0f}, {"train_loss", 0.5f}}));
  const Event second = parse_event(records[2]);
  EXPECT_EQ(second.step, 50);
  EXPECT_EQ(second.values, (std::vector<std::pair<std::string, float>>{{"train_loss", 0.25f}}));
  const Event third = parse_event(records[3]);
  EXPECT_EQ(third.step, int64_t{1} << 40);
  EXPECT_EQ(third.values,
            (std::vector<std::pair<std::string, float>>{{"val_acc", 0.875f}, {"val_loss", static_cast<float>(1.0 / 3.0)}}));
}

// Inside the Trainer, beside a CSVLogger: the event file holds the same rows (step, name, value)
// as metrics.csv.
TEST(TensorBoardLoggerTest, InsideTheTrainerItRecordsWhatTheCsvLoggerRecords) {
  TempDir root{"lockstep_tb_trainer"};
  auto tensorboard = std::make_shared<TensorBoardLogger>(LoggerOptions(root.path()).name("tb"));
  auto csv = std::make_shared<CSVLogger>(LoggerOptions(root.path()).name("csv"));
  Trainer trainer(lockstep::testing::quiet_options(root).max_epochs(2).log_every_n_steps(1));
  trainer.add_logger(tensorboard);
  trainer.add_logger(csv);
  torch::manual_seed(2);
  trainer.fit(std::make_shared<lockstep::testing::Regressor>(),
              lockstep::testing::loader_of(lockstep::testing::regression_data(32), 8),
              lockstep::testing::loader_of(lockstep::testing::regression_data(16, 8, 9), 8));

  std::vector<std::tuple<int64_t, std::string, float>> from_csv, from_events;
  std::ifstream in(csv->metrics_file());
  std::string line;
  std::getline(in, line);
  std::vector<std::string> columns;
  for (std::istringstream header(line); std::getline(header, line, ',');) columns.push_back(line);
  while (std::getline(in, line)) {
    std::vector<std::string> cells;
    std::istringstream row(line);
    for (std::string cell; std::getline(row, cell, ',');) cells.push_back(cell);
    for (size_t c = 1; c < cells.size(); ++c) {
      if (!cells[c].empty()) from_csv.emplace_back(std::stoll(cells[0]), columns[c], std::stof(cells[c]));
    }
  }
  const auto files = event_files(tensorboard->log_dir());
  ASSERT_EQ(files.size(), 1u);
  const auto records = read_records(files[0]);
  for (size_t i = 1; i < records.size(); ++i) {
    const Event event = parse_event(records[i]);
    for (const auto& [name, value] : event.values) from_events.emplace_back(event.step, name, value);
  }
  std::sort(from_csv.begin(), from_csv.end());
  std::sort(from_events.begin(), from_events.end());
  EXPECT_GE(from_events.size(), 8u) << "4 training steps and 2 validations, each with its epoch";
  ASSERT_EQ(from_events.size(), from_csv.size());
  for (size_t i = 0; i < from_events.size(); ++i) {
    const auto& [step, name, value] = from_events[i];
    EXPECT_EQ(step, std::get<0>(from_csv[i])) << i;
    EXPECT_EQ(name, std::get<1>(from_csv[i])) << i;
    // The CSV holds the double in decimal, the event the float: equal to float precision.
    EXPECT_NEAR(value, std::get<2>(from_csv[i]), 1e-6 * std::max(1.0f, std::abs(value))) << name << " at " << step;
  }
}

TEST(TensorBoardLoggerTest, EachEventIsOnDiskWhenLogMetricsReturns) {
  TempDir root{"lockstep_tb"};
  TensorBoardLogger logger(LoggerOptions(root.path()));
  logger.log_metrics({{"loss", 2}}, 1);
  EXPECT_EQ(read_records(logger.event_file()).size(), 2u);
  logger.log_metrics({{"loss", 1}}, 2);
  EXPECT_EQ(read_records(logger.event_file()).size(), 3u);
}

TEST(TensorBoardLoggerTest, LoggingAfterFinalizeAppendsToTheSameFile) {
  TempDir root{"lockstep_tb"};
  TensorBoardLogger logger(LoggerOptions(root.path()));
  logger.log_metrics({{"loss", 2}}, 1);
  logger.finalize("success");
  logger.log_metrics({{"loss", 1}}, 2);
  logger.finalize("success");
  ASSERT_EQ(event_files(logger.log_dir()).size(), 1u);
  const auto records = read_records(logger.event_file());
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(parse_event(records[2]).step, 2);
}

TEST(TensorBoardLoggerTest, AVanishedFolderIsAnIoErrorNamingTheEventFile) {
  TempDir root{"lockstep_tb"};
  TensorBoardLogger logger(LoggerOptions(root.path()));
  logger.log_metrics({{"loss", 2}}, 1);
  logger.finalize("success");
  fs::remove_all(logger.log_dir());
  try {
    logger.log_metrics({{"loss", 1}}, 2);
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_EQ(e.path(), logger.event_file());
    EXPECT_EQ(e.code(), std::errc::no_such_file_or_directory);
    EXPECT_NE(std::string(e.what()).find("reopening the TensorBoard event file '" + logger.event_file() + "'"),
              std::string::npos)
        << e.what();
  }
}

TEST(TensorBoardLoggerTest, VersionsAndHparamsMatchTheCsvLogger) {
  TempDir root{"lockstep_tb"};
  fs::create_directories(root.path() + "/lockstep_logs/version_0");
  TensorBoardLogger logger(LoggerOptions(root.path()));
  EXPECT_EQ(logger.version(), "version_1");
  logger.log_hyperparams({{"lr", 0.1}});
  std::ifstream in(logger.log_dir() + "/hparams.yaml");
  const std::string yaml((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(yaml, "lr: 0.1\n");
}

}  // namespace
}  // namespace loggers
}  // namespace lockstep

namespace lockstep {
namespace loggers {
namespace tensorboard_hparams_test {

// One field of `message` by number (the first), or an empty field.
Field field_of(const std::string& message, uint32_t number) {
  for (const auto& field : decode(message)) {
    if (field.number == number) return field;
  }
  ADD_FAILURE() << "no field " << number;
  return {};
}

}  // namespace tensorboard_hparams_test

namespace {

using tensorboard_hparams_test::field_of;

// The HParams tab's session_start_info: each hparam typed (number_value 2, string_value 3,
// bool_value 4 of google.protobuf.Value), nested names joined with "/".
TEST(TensorBoardLoggerTest, HparamsReachTheHparamsTabTyped) {
  TempDir root{"lockstep_tb"};
  TensorBoardLogger logger(LoggerOptions(root.path()));
  logger.log_hyperparams({{"lr", 0.1}, {"optim", {{"name", "adam"}, {"amsgrad", true}}}, {"layers", {4, 2}}});
  const auto records = read_records(logger.event_file());
  ASSERT_EQ(records.size(), 2u) << "the file version, then the hparams";
  const Field summary_value = field_of(field_of(records[1], 5).bytes, 1);
  EXPECT_EQ(field_of(summary_value.bytes, 1).bytes, "_hparams_/session_start_info");
  const Field plugin = field_of(field_of(summary_value.bytes, 9).bytes, 1);
  EXPECT_EQ(field_of(plugin.bytes, 1).bytes, "hparams");
  const Field session = field_of(field_of(plugin.bytes, 2).bytes, 3);
  std::map<std::string, Field> hparams;
  for (const auto& entry : decode(session.bytes)) {
    hparams[field_of(entry.bytes, 1).bytes] = decode(field_of(entry.bytes, 2).bytes).at(0);
  }
  ASSERT_EQ(hparams.size(), 4u);
  double lr = 0;
  std::memcpy(&lr, &hparams.at("lr").integer, 8);
  EXPECT_EQ(hparams.at("lr").number, 2u);
  EXPECT_EQ(lr, 0.1);
  EXPECT_EQ(hparams.at("optim/name").number, 3u);
  EXPECT_EQ(hparams.at("optim/name").bytes, "adam");
  EXPECT_EQ(hparams.at("optim/amsgrad").number, 4u);
  EXPECT_EQ(hparams.at("optim/amsgrad").integer, 1u);
  EXPECT_EQ(hparams.at("layers").bytes, "[4,2]");
}

}  // namespace
}  // namespace loggers
}  // namespace lockstep
