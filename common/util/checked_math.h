// Overflow-checked int64 arithmetic for sizes computed from untrusted input (model dimensions,
// row counts, byte counts), so that a size is compared with its limit before it can wrap around.
#ifndef PIPETRAIN_COMMON_UTIL_CHECKED_MATH_H_
#define PIPETRAIN_COMMON_UTIL_CHECKED_MATH_H_

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>

namespace pipetrain::util {

// a * b, or nullopt if the product does not fit in int64.
inline std::optional<int64_t> CheckedMul(int64_t a, int64_t b) {
  int64_t out;
  if (__builtin_mul_overflow(a, b, &out)) return std::nullopt;
  return out;
}

// The product of `factors` (1 for none), or nullopt if it, or a partial product, overflows.
inline std::optional<int64_t> CheckedProduct(std::initializer_list<int64_t> factors) {
  int64_t out = 1;
  for (int64_t f : factors) {
    if (__builtin_mul_overflow(out, f, &out)) return std::nullopt;
  }
  return out;
}

// a + b, or nullopt if the sum does not fit in int64.
inline std::optional<int64_t> CheckedAdd(int64_t a, int64_t b) {
  int64_t out;
  if (__builtin_add_overflow(a, b, &out)) return std::nullopt;
  return out;
}

// `n` in decimal, or "more than 2^63" when it is empty (an overflowed result), for messages.
inline std::string CheckedToString(std::optional<int64_t> n) {
  return n.has_value() ? std::to_string(*n) : std::string("more than 2^63");
}

}  // namespace pipetrain::util

#endif  // PIPETRAIN_COMMON_UTIL_CHECKED_MATH_H_
