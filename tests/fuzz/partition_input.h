// The byte format of the partition fuzz target's inputs (tests/fuzz/partition_fuzzer.cc), shared
// with the seed writer (write_fuzz_seeds.cc), which encodes with the same functions.
//
//   byte 0   flags: bits 0-1 placement (0 linear, 1 looped, 2 V-shape, 3 looped), bit 2 speeds,
//            bit 3 layer memory and memory caps, bit 4 boundary times, bit 5 also simulate,
//            bit 6 take the virtual stages from byte 2 even for linear and V-shape placements
//   byte 1   stages S = 1 + b % 6
//   byte 2   virtual stages V = 1 + b % 3 (linear: 1, V-shape: 2 unless bit 6)
//   byte 3   layers L = 1 + b % 24 (small enough that the looped search, whose node budget a
//            cut of 18 chunks exhausts, takes well under a second even under ASan)
//   numbers  L costs; then S speeds (bit 2); L layer memories and S caps (bit 3); L-1 boundary
//            times (bit 4)
//   simulate (bit 5): a schedule kind byte (index into kAllScheduleKinds), S = 1 + b % 4,
//            M = 1 + b % 8, V = 1 + b % 3; then for every chunk 4 FLOP counts (F, B, I, W); S
//            worker speeds; link latency and bandwidth; a flag byte (bit 0 boundary bytes,
//            bit 1 activation bytes) and those numbers, one per chunk.
//
// A number is a tag byte: 0-199 the value itself, 200-239 an entry of kInterestingValues (tag -
// 200, modulo its size), 240-255 the next 8 bytes as a little-endian IEEE double. Past the end of
// the input every byte reads as 1 and every number as 1.
#ifndef PIPETRAIN_TESTS_FUZZ_PARTITION_INPUT_H_
#define PIPETRAIN_TESTS_FUZZ_PARTITION_INPUT_H_

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

namespace pipetrain::fuzz {

// Values at and beyond the edges of the partitioner's and the simulator's ranges.
inline constexpr double kInterestingValues[] = {
    0.0,
    -0.0,
    -1.0,
    0.5,
    5e-324,  // the smallest subnormal
    1e-310,
    1e-300,
    1e-3,
    1e9,
    1e18,
    1e30,
    1e33,
    2e30,
    1e200,
    1e308,
    std::numeric_limits<double>::max(),
    std::numeric_limits<double>::infinity(),
    -std::numeric_limits<double>::infinity(),
    std::numeric_limits<double>::quiet_NaN(),
    9.99e-4,
    1.0000001e30,
    1e-6,  // appended: the seeds' tags keep their values
    9.99e-7,
};
inline constexpr int kInterestingCount =
    static_cast<int>(sizeof(kInterestingValues) / sizeof(kInterestingValues[0]));

// Reads the format above from a byte range it does not own.
class PartitionInputReader {
 public:
  PartitionInputReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  uint8_t Byte() { return pos_ < size_ ? data_[pos_++] : 1; }

  double Number() {
    const uint8_t tag = Byte();
    if (tag < 200) return tag;
    if (tag < 240) return kInterestingValues[(tag - 200) % kInterestingCount];
    if (size_ - pos_ < 8) {
      pos_ = size_;
      return 1;
    }
    uint64_t bits = 0;
    for (int i = 0; i < 8; ++i) bits |= uint64_t{data_[pos_ + i]} << (8 * i);
    pos_ += 8;
    double x;
    std::memcpy(&x, &bits, sizeof x);
    return x;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// Appends the encoding of a number: the shortest of the three forms that gives `x` bit for bit.
inline void AppendNumber(double x, std::string* out) {
  if (x >= 0 && x < 200 && x == static_cast<double>(static_cast<int>(x)) && !std::signbit(x)) {
    out->push_back(static_cast<char>(static_cast<int>(x)));
    return;
  }
  uint64_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  for (int i = 0; i < kInterestingCount; ++i) {
    uint64_t other;
    std::memcpy(&other, &kInterestingValues[i], sizeof other);
    if (other == bits) {
      out->push_back(static_cast<char>(200 + i));
      return;
    }
  }
  out->push_back(static_cast<char>(240));
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((bits >> (8 * i)) & 0xFF));
}

}  // namespace pipetrain::fuzz

#endif  // PIPETRAIN_TESTS_FUZZ_PARTITION_INPUT_H_
