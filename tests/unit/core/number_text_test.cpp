#include <lockstep/core/number_text.h>

#include <gtest/gtest.h>

namespace lockstep {
namespace {

TEST(WholeNumber, ReadsTheWholeTextOrNothing) {
  EXPECT_EQ(whole_number("0.25"), 0.25);
  EXPECT_EQ(whole_number("10"), 10.0);
  EXPECT_EQ(whole_number("1e3"), 1000.0);
  EXPECT_EQ(whole_number("-2"), -2.0);
  for (const char* bad : {"", "abc", "1.5x", "25M", " ", "1e999"}) EXPECT_FALSE(whole_number(bad)) << "'" << bad << "'";
}

}  // namespace
}  // namespace lockstep
