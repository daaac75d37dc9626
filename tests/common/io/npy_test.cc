#include "common/io/npy.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/io/npy_test_util.h"

namespace pipetrain::io {
namespace {

using ::pipetrain::testing::Bytes;
using ::pipetrain::testing::Npy;
using ::pipetrain::testing::NpyWithHeader;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// What numpy 1.24 writes for np.save(f, np.arange(6, dtype=np.float32).reshape(2, 3)), byte for
// byte (the header is padded to 128 bytes).
TEST(NpyHeaderTest, ParsesWhatNumpyWrites) {
  const std::string header =
      "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }" + std::string(58, ' ') + "\n";
  ASSERT_EQ(10 + header.size(), 128u);
  const std::string file = std::string("\x93NUMPY\x01\x00", 8) + std::string(1, '\x76') +
                           std::string(1, '\0') + header +
                           Bytes(std::vector<float>{0, 1, 2, 3, 4, 5});
  absl::StatusOr<NpyHeader> h = ParseNpyHeader(file, "a.npy");
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->major_version, 1);
  EXPECT_EQ(h->descr, "<f4");
  EXPECT_EQ(h->kind, 'f');
  EXPECT_EQ(h->item_bytes, 4);
  EXPECT_THAT(h->shape, ElementsAre(2, 3));
  EXPECT_EQ(h->elements, 6);
  EXPECT_EQ(h->data_offset, 128);
  EXPECT_EQ(NpyDtypeName(*h), "float32");
}

TEST(NpyHeaderTest, AcceptsVersions2And3AndEveryShapeSpelling) {
  for (int major : {1, 2, 3}) {
    absl::StatusOr<NpyHeader> h =
        ParseNpyHeader(Npy("<i8", "(3,)", Bytes(std::vector<int64_t>{1, 2, 3}), major), "v");
    ASSERT_TRUE(h.ok()) << major << ": " << h.status();
    EXPECT_EQ(h->major_version, major);
    EXPECT_THAT(h->shape, ElementsAre(3));
    EXPECT_EQ(NpyDtypeName(*h), "int64");
  }
  // Double quotes, no trailing comma, keys in any order, a 0-d array, Python 2's 'L' suffix.
  const std::string four = Bytes(std::vector<int32_t>{7});
  for (const std::string& dict :
       {std::string("{\"shape\": (), \"fortran_order\": False, \"descr\": \"<i4\"}"),
        std::string("{'descr':'<i4','fortran_order':False,'shape':(1L,)}"),
        std::string("{'descr': '<i4', 'fortran_order': False, 'shape': (1, 1, 1,), }")}) {
    absl::StatusOr<NpyHeader> h = ParseNpyHeader(NpyWithHeader(dict, four), "x");
    ASSERT_TRUE(h.ok()) << dict << ": " << h.status();
    EXPECT_EQ(h->elements, 1);
  }
  // An empty array is fine for the parser (the data sets refuse it).
  absl::StatusOr<NpyHeader> empty = ParseNpyHeader(Npy("<f4", "(0, 5)", ""), "e");
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->elements, 0);
}

void ExpectRefused(const std::string& bytes, const std::string& message) {
  absl::StatusOr<NpyHeader> h = ParseNpyHeader(bytes, "f.npy");
  ASSERT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument) << message;
  EXPECT_THAT(h.status().message(), HasSubstr(message));
  EXPECT_THAT(std::string(h.status().message()), ::testing::StartsWith("f.npy: "));
}

TEST(NpyHeaderTest, RefusesWhatADataSetCannotHold) {
  const std::string f4 = Bytes(std::vector<float>{1, 2});
  ExpectRefused(Npy(">f4", "(2,)", f4),
                "dtype '>f4' is big-endian; save it little-endian: "
                "a.astype('<f4')");
  ExpectRefused(NpyWithHeader("{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }", f4),
                "fortran_order is True (a column-major array); save a C-order array");
  ExpectRefused(Npy("|O", "(2,)", std::string(16, '\0')), "is an object array");
  ExpectRefused(Npy("<U3", "(2,)", std::string(24, '\0')), "holds strings");
  ExpectRefused(Npy("<c8", "(1,)", std::string(8, '\0')), "is not a supported number type");
  ExpectRefused(Npy("<f3", "(1,)", std::string(3, '\0')), "is not a supported number type");
  ExpectRefused(Npy("f4", "(1,)", std::string(4, '\0')), "has no byte order");
  ExpectRefused(Npy("|i4", "(1,)", std::string(4, '\0')), "has no byte order but more than");
  ExpectRefused(
      NpyWithHeader("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }", f4),
      "the dtype is structured");
}

TEST(NpyHeaderTest, RefusesMalformedFiles) {
  const std::string f4 = Bytes(std::vector<float>{1, 2});
  ExpectRefused("", "not a .npy file");
  ExpectRefused("PK\x03\x04 a zip file", "not a .npy file");
  ExpectRefused(std::string("\x93NUMPY\x04\x00", 8) + std::string(64, ' '),
                "version 4.0 is not one of 1.0, 2.0 and 3.0");
  ExpectRefused(std::string("\x93NUMPY\x01\x00\x10", 9), "the header is truncated");
  ExpectRefused(std::string("\x93NUMPY\x01\x00\x40\x00{'descr'", 17),
                "the header is truncated: it says 64 bytes");
  ExpectRefused(std::string("\x93NUMPY\x02\x00\xff\xff\xff\x7f", 12),
                "header of 2147483647 bytes is longer than the limit of 65536");
  ExpectRefused(Npy("<f4", "(3,)", f4), "needs 12 data bytes, the file has 8 (truncated)");
  ExpectRefused(Npy("<f4", "(1,)", f4), "needs 4 data bytes, the file has 8 (trailing bytes)");
  ExpectRefused(Npy("<f4", "(-2,)", f4), "a dimension is negative");
  ExpectRefused(Npy("<f4", "(2)", f4), "a one-element shape needs a trailing comma");
  ExpectRefused(Npy("<f4", "[2]", f4), "shape must be a tuple");
  ExpectRefused(Npy("<f4", "(4611686018427387904, 4611686018427387904)", f4),
                "the shape's byte size overflows 64 bits");
  ExpectRefused(Npy("<f4", "(99999999999999999999,)", f4), "a dimension is larger than 2^62");
  ExpectRefused(Npy("<f4", "(4611686018427387905,)", f4), "a dimension is larger than 2^62");
  ExpectRefused(Npy("<f4", "(4611686018427387904,)", f4), "the shape's byte size overflows");
  ExpectRefused(NpyWithHeader("['descr']", f4), "header is not a dictionary");
  ExpectRefused(NpyWithHeader("{'descr': '<f4', 'shape': (2,)}", f4),
                "the header lacks 'fortran_order'");
  ExpectRefused(NpyWithHeader("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, "
                              "'shape': (2,)}",
                              f4),
                "the key 'descr' appears twice");
  ExpectRefused(NpyWithHeader("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), "
                              "'extra': 1}",
                              f4),
                "unknown key 'extra'");
  ExpectRefused(NpyWithHeader("{'descr': '<f4', 'fortran_order': 0, 'shape': (2,)}", f4),
                "fortran_order must be True or False");
  ExpectRefused(NpyWithHeader("{'descr': '<f4', 'fortran_order': False, 'shape': (2,)} x", f4),
                "text after the dictionary");
  ExpectRefused(NpyWithHeader("{'descr' '<f4', 'fortran_order': False, 'shape': (2,)}", f4),
                "no ':' after the key 'descr'");
  ExpectRefused(NpyWithHeader("{'descr': '<f\\x34', 'fortran_order': False, 'shape': (2,)}", f4),
                "escape sequence in a string");
  ExpectRefused(NpyWithHeader("{'descr': '<f4' 'fortran_order': False}", f4),
                "expected ',' or '}' after a value");
  ExpectRefused(NpyWithHeader("{'descr", f4), "unterminated string");
}

}  // namespace
}  // namespace pipetrain::io
