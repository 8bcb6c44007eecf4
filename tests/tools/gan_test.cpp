// examples/gan, run as a user runs it on 2 processes: with --strategy ddp_separate the generator
// and the discriminator train in alternation, the replicas stay identical, the losses stay finite
// and every epoch leaves a PNG grid of samples; one DDP around the whole GAN (--strategy ddp)
// fails with the unused-parameter error, as the MMGeneration docs describe, and names the fix.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>


#include "../support/command.h"
#include "../support/paths.h"
#include "../support/png_image.h"
#include "../support/temp_dir.h"

namespace lockstep {
namespace {

using testing::run_command;

const std::string gan_bin = std::string(LOCKSTEP_BIN_DIR) + "/gan";

testing::CommandResult run_gan(const std::string& root, const std::vector<std::string>& extra) {
  std::vector<std::string> argv{gan_bin,         "--devices",           "2",       "--max-epochs",
                                "2",             "--limit-train-batches", "3",     "--batch-size",
                                "16",            "--enable-progress-bar", "false", "--enable-checkpointing",
                                "false",         "--seed",              "7",       "--log-every-n-steps",
                                "1",             "--width",             "16",      "--default-root-dir",
                                root};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return run_command(argv, {{"PATH", "/usr/bin:/bin"}, {"HOME", "/tmp"}, {"LOCKSTEP_NO_BLAS_WARNING", "1"}},
                     std::chrono::seconds(90));
}

// Values of `column` in a metrics.csv, for the rows that have one.
std::vector<double> column_values(const std::string& csv, const std::string& column) {
  std::ifstream in(csv);
  std::string header;
  std::getline(in, header);
  std::vector<std::string> names;
  std::istringstream hs(header);
  for (std::string name; std::getline(hs, name, ',');) names.push_back(name);
  const auto at = std::find(names.begin(), names.end(), column) - names.begin();
  std::vector<double> values;
  for (std::string line; std::getline(in, line);) {
    std::istringstream ls(line);
    std::string cell;
    for (long k = 0; std::getline(ls, cell, ','); ++k) {
      if (k == at && !cell.empty()) values.push_back(std::stod(cell));
    }
  }
  return values;
}

TEST(GanExample, SeparateDDPTrainsBothPartsAndWritesSampleGrids) {
  testing::TempDir dir("lockstep_gan");
  const auto result = run_gan(dir.path(), {});
  ASSERT_EQ(result.exit_code, 0) << result.err << result.out;
  EXPECT_NE(result.err.find("gan: replicas identical across 2 process(es): max |difference| of parameters = 0"),
            std::string::npos)
      << result.err;

  const auto version = std::filesystem::path(dir.path()) / "lockstep_logs" / "version_0";
  for (const char* loss : {"d_loss", "g_loss"}) {
    const auto values = column_values((version / "metrics.csv").string(), loss);
    EXPECT_EQ(values.size(), 6u) << loss << ": one row per step, 3 steps x 2 epochs";
    for (double v : values) EXPECT_TRUE(std::isfinite(v) && v > 0) << loss << " = " << v;
  }
  for (int epoch = 0; epoch < 2; ++epoch) {
    const auto png = version / "samples" / ("epoch_" + std::to_string(epoch) + ".png");
    int width = 0, height = 0, channels = 0;
    unsigned char* pixels = stbi_load(png.c_str(), &width, &height, &channels, 0);
    ASSERT_NE(pixels, nullptr) << png << ": " << stbi_failure_reason();
    EXPECT_EQ(width, 8 * 28);
    EXPECT_EQ(height, 8 * 28);
    EXPECT_EQ(channels, 1);
    // Generated images, not a blank picture: the pixels vary.
    const auto [lo, hi] = std::minmax_element(pixels, pixels + width * height);
    EXPECT_GT(*hi - *lo, 50) << png;
    stbi_image_free(pixels);
  }
}

TEST(GanExample, OneDDPAroundTheWholeGanFailsAndNamesTheFix) {
  testing::TempDir dir("lockstep_gan");
  const auto result = run_gan(dir.path(), {"--strategy", "ddp"});
  EXPECT_NE(result.exit_code, 0) << result.err << result.out;
  EXPECT_NE(result.exit_code, -1) << "timed out: " << result.err;
  EXPECT_NE(result.err.find("parameters were not used in producing loss: generator."), std::string::npos)
      << result.err;
  EXPECT_NE(result.err.find("use --strategy ddp_separate"), std::string::npos) << result.err;
}

// The GAN holds its BatchNorms in typed members, which convert_sync_batchnorm cannot rebind:
// --sync-batchnorm true is refused at setup, naming the layers and the fix, before any step.
TEST(GanExample, SyncBatchNormWithTypedMembersIsRefusedAtSetup) {
  testing::TempDir dir("lockstep_gan");
  const auto result = run_gan(dir.path(), {"--sync-batchnorm", "true"});
  EXPECT_EQ(result.exit_code, 2) << result.err << result.out;
  EXPECT_NE(result.err.find("--sync-batchnorm true cannot convert the BatchNorm layer(s) 'generator.bn0', "
                            "'generator.bn1', 'discriminator.bn2'"),
            std::string::npos) << result.err;
  EXPECT_NE(result.err.find("Declare those members as lockstep::distributed::SyncBatchNorm"), std::string::npos)
      << result.err;
}

}  // namespace
}  // namespace lockstep
