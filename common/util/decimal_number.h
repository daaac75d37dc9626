// The decimal number syntax of pipetrain's text inputs (CSV data files, optimizer settings).
// absl::SimpleAtof and strtod also read hexadecimal integers and floats ("0x10", "0x1p-3"),
// "inf", "infinity" and "nan"; where a format is documented as decimal, those are refused by
// checking the text with IsDecimalNumber first. Pure functions; thread-safe.
#ifndef PIPETRAIN_COMMON_UTIL_DECIMAL_NUMBER_H_
#define PIPETRAIN_COMMON_UTIL_DECIMAL_NUMBER_H_

#include "absl/strings/ascii.h"
#include "absl/strings/string_view.h"

namespace pipetrain::util {

// True if `text`, without leading and trailing ASCII whitespace, is a decimal number:
// an optional sign, digits with an optional decimal point (at least one digit before or after
// it), and an optional exponent `e`/`E`, optional sign, digits. "1", "-2.5", ".5", "3.", "+4e-1"
// are; "", ".", "e5", "0x10", "0x1p3", "inf", "nan", "1e", "1_0" are not. Says nothing about
// range: "1e999" is decimal (and overflows a double).
inline bool IsDecimalNumber(absl::string_view text) {
  text = absl::StripAsciiWhitespace(text);
  size_t i = 0;
  const size_t n = text.size();
  auto digits = [&] {
    const size_t start = i;
    while (i < n && absl::ascii_isdigit(static_cast<unsigned char>(text[i]))) ++i;
    return i - start;
  };
  if (i < n && (text[i] == '+' || text[i] == '-')) ++i;
  size_t mantissa = digits();
  if (i < n && text[i] == '.') {
    ++i;
    mantissa += digits();
  }
  if (mantissa == 0) return false;
  if (i < n && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    if (i < n && (text[i] == '+' || text[i] == '-')) ++i;
    if (digits() == 0) return false;
  }
  return i == n;
}

}  // namespace pipetrain::util

#endif  // PIPETRAIN_COMMON_UTIL_DECIMAL_NUMBER_H_
