#include <lockstep/plan/batch_limit.h>

#include <gtest/gtest.h>

#include <lockstep/core/error.h>

namespace lockstep {
namespace {

std::string error_of(const std::string& text) {
  try {
    BatchLimit::parse(text, "--limit-train-batches");
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(BatchLimit, AFractionOrACountOfTheBatches) {
  EXPECT_EQ(BatchLimit().of(10), 10) << "all by default";
  EXPECT_EQ(BatchLimit(0.25).of(10), 2) << "floor of the fraction";
  EXPECT_EQ(BatchLimit(4).of(10), 4);
  EXPECT_EQ(BatchLimit(40).of(10), 10) << "a count beyond the epoch is the epoch";
  EXPECT_EQ(BatchLimit(0).of(10), 0);
  EXPECT_EQ(BatchLimit::parse("0.5", "--x"), BatchLimit(0.5));
  EXPECT_EQ(BatchLimit::parse("1e-1", "--x"), BatchLimit(0.1));
  EXPECT_EQ(BatchLimit::parse("7", "--x"), BatchLimit(7));
  EXPECT_TRUE(BatchLimit::parse("1.0", "--x").is_fraction());
  EXPECT_FALSE(BatchLimit::parse("1", "--x").is_fraction()) << "1 is one batch, 1.0 is all of them (Lightning)";
  for (const char* text : {"0.25", "10", "1.0", "0"}) {
    EXPECT_EQ(BatchLimit::parse(BatchLimit::parse(text, "--x").str(), "--x"), BatchLimit::parse(text, "--x")) << text;
  }
}

TEST(BatchLimit, BadValuesNameTheFlagAndTheFix) {
  EXPECT_NE(error_of("lots").find("--limit-train-batches 'lots' is neither a fraction (0.25) nor a batch count (10)"),
            std::string::npos);
  EXPECT_NE(error_of("").find("neither a fraction"), std::string::npos);
  EXPECT_NE(error_of("1.5").find("at most 1.0; for a count write an integer"), std::string::npos);
  EXPECT_NE(error_of("-2").find("must be 0 or more"), std::string::npos);
  EXPECT_NE(error_of("nan").find("neither a fraction"), std::string::npos);
  EXPECT_NE(error_of("99999999999999999999").find("too many batches"), std::string::npos);
  EXPECT_THROW(BatchLimit(1.5), UsageError);
  EXPECT_THROW(BatchLimit(-1), UsageError);
}

}  // namespace
}  // namespace lockstep
