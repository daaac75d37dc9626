#include "common/util/decimal_number.h"

#include "gtest/gtest.h"

namespace pipetrain::util {
namespace {

TEST(DecimalNumberTest, DecimalFormsAreAccepted) {
  for (const char* text : {"0", "1", "-2.5", "+4", ".5", "3.", "1e5", "1E+5", "2.5e-3", "-.5e1",
                           " 7", "7 ", "\t-1\r", "1e999", "000123"}) {
    EXPECT_TRUE(IsDecimalNumber(text)) << "'" << text << "'";
  }
}

TEST(DecimalNumberTest, EverythingElseIsRefused) {
  for (const char* text :
       {"",     " ",    ".",     "+",      "-",   "e5",    ".e5",      "1e",      "1e+",
        "0x10", "0X1A", "0x1p3", "0x.8p1", "inf", "-inf",  "Infinity", "nan",     "NaN",
        "1_0",  "1,5",  "1.2.3", "--1",    "+-1", "1e5.0", "1 2",      "\xd9\xa3"}) {
    EXPECT_FALSE(IsDecimalNumber(text)) << "'" << text << "'";
  }
}

}  // namespace
}  // namespace pipetrain::util
