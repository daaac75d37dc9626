#include "common/io/safetensors.h"

#include <stdlib.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/io/file_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::io {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

float FromBits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

std::vector<uint32_t> AllBits(const std::vector<float>& v) {
  std::vector<uint32_t> out;
  for (float f : v) out.push_back(Bits(f));
  return out;
}

std::string Le64(uint64_t v) {
  std::string s;
  for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  return s;
}

std::string F32Bytes(const std::vector<float>& v) {
  std::string s(4 * v.size(), '\0');
  if (!v.empty()) std::memcpy(s.data(), v.data(), s.size());  // test host is little-endian
  return s;
}

// A file with the given header text (no padding added) and data buffer.
std::string MakeFile(const std::string& header, const std::string& buffer) {
  return Le64(header.size()) + header + buffer;
}

std::string SourceDir() {
  const char* dir = std::getenv("PIPETRAIN_SOURCE_DIR");
  return dir != nullptr ? dir : ".";
}

TEST(SafetensorsTest, ReadsIndependentlyWrittenFixture) {
  absl::StatusOr<SafetensorsFile> file =
      ReadSafetensors(SourceDir() + "/tests/fixtures/reference.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->tensors.size(), 9u);
  EXPECT_EQ(file->metadata,
            (std::map<std::string, std::string>{
                {"format", "pt"}, {"producer", "make_safetensors_fixture.py"}, {"step", "42"}}));

  const math::Tensor& w = file->tensors.at("layers.0.weight");
  EXPECT_THAT(w.shape, ElementsAre(3, 4));
  ASSERT_EQ(w.data.size(), 12u);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(w.data[i], i * 0.5f - 1.0f) << i;

  const math::Tensor& b = file->tensors.at("layers.0.bias");
  EXPECT_THAT(b.shape, ElementsAre(4));
  EXPECT_THAT(b.data, ElementsAre(100.0f, 101.0f, 102.0f, 103.0f));

  const math::Tensor& cube = file->tensors.at("layers.2.cube");
  EXPECT_THAT(cube.shape, ElementsAre(2, 3, 4));
  ASSERT_EQ(cube.data.size(), 24u);
  for (int i = 0; i < 24; ++i) EXPECT_EQ(cube.data[i], i / 8.0f) << i;

  const math::Tensor& scalar = file->tensors.at("step_scale");
  EXPECT_TRUE(scalar.shape.empty());
  EXPECT_THAT(scalar.data, ElementsAre(3.25f));

  const math::Tensor& empty = file->tensors.at("empty");
  EXPECT_THAT(empty.shape, ElementsAre(2, 0));
  EXPECT_TRUE(empty.data.empty());

  const math::Tensor& special = file->tensors.at("special");
  EXPECT_THAT(special.shape, ElementsAre(7));
  EXPECT_THAT(AllBits(special.data), ElementsAre(0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC01234u,
                                                 0x00000001u, 0x7F7FFFFFu, 0x7F800001u));

  const math::Tensor& half = file->tensors.at("half");
  EXPECT_THAT(half.shape, ElementsAre(4));
  EXPECT_THAT(half.data, ElementsAre(1.0f, -2.5f, 65504.0f, std::ldexp(1.0f, -24)));

  const math::Tensor& brain = file->tensors.at("brain");
  EXPECT_THAT(brain.data, ElementsAre(1.0f, -3.0f, std::ldexp(1.0f, 100)));

  const math::Tensor& dbl = file->tensors.at("double");
  EXPECT_THAT(dbl.data, ElementsAre(0.1f, -std::numeric_limits<float>::infinity(), 1.5f));
}

TEST(SafetensorsTest, SerializesExactReferenceLayout) {
  std::map<std::string, math::Tensor> tensors;
  tensors["b"] = math::Tensor{{2}, {1.0f, 2.0f}};
  tensors["a"] = math::Tensor{{}, {0.5f}};
  absl::StatusOr<std::string> bytes = SerializeSafetensors(tensors, {{"k", "v\"\n"}});
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  std::string header =
      R"({"__metadata__":{"k":"v\"\n"},"a":{"dtype":"F32","shape":[],"data_offsets":[0,4]},)"
      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  ASSERT_EQ(header.size() % 8, 0u);
  EXPECT_EQ(*bytes, MakeFile(header, F32Bytes({0.5f, 1.0f, 2.0f})));
}

TEST(SafetensorsTest, SerializesEmptyFile) {
  absl::StatusOr<std::string> bytes = SerializeSafetensors({}, {});
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(*bytes, MakeFile("{}      ", ""));
  absl::StatusOr<SafetensorsFile> file = ParseSafetensors(*bytes, "empty");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE(file->tensors.empty());
  EXPECT_TRUE(file->metadata.empty());
}

TEST(SafetensorsTest, RoundTripIsBitwise) {
  std::mt19937 gen(7);
  std::map<std::string, math::Tensor> tensors;
  math::Tensor special{
      {3, 3},
      {-0.0f, 0.0f, FromBits(0x7FC0BEEF), FromBits(0xFFA00001), FromBits(1), FromBits(0x807FFFFF),
       std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
       std::numeric_limits<float>::max()}};
  tensors["layers.1.special"] = special;
  math::Tensor random{{17, 5}, {}};
  for (int i = 0; i < 85; ++i) random.data.push_back(FromBits(static_cast<uint32_t>(gen())));
  tensors["layers.0.weight"] = random;
  tensors["optim.0.weight.exp_avg"] = math::Tensor{{0}, {}};
  tensors["scalar"] = math::Tensor{{}, {42.0f}};
  tensors["unicode.ünï"] = math::Tensor{{1, 1, 1}, {-1.0f}};
  const std::map<std::string, std::string> metadata = {{"manifest", "{\"step\": 3}"},
                                                       {"tab\there", "ctrl\x01"}};

  absl::StatusOr<std::string> first = SerializeSafetensors(tensors, metadata);
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<SafetensorsFile> parsed = ParseSafetensors(*first, "first");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->metadata, metadata);
  ASSERT_EQ(parsed->tensors.size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    const math::Tensor& got = parsed->tensors.at(name);
    EXPECT_EQ(got.shape, t.shape) << name;
    EXPECT_EQ(AllBits(got.data), AllBits(t.data)) << name;
  }
  absl::StatusOr<std::string> second = SerializeSafetensors(parsed->tensors, parsed->metadata);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(*first, *second);
}

TEST(SafetensorsTest, WriteThenReadFile) {
  std::string dir = ::testing::TempDir() + "/pipetrain_st_XXXXXX";
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  const std::string path = dir + "/stage0.safetensors";
  std::map<std::string, math::Tensor> tensors;
  tensors["layers.3.weight"] = math::Tensor{{2, 2}, {1, 2, 3, 4}};
  ASSERT_TRUE(WriteSafetensors(path, tensors, {{"step", "9"}}).ok());
  absl::StatusOr<SafetensorsFile> file = ReadSafetensors(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_THAT(file->tensors.at("layers.3.weight").data, ElementsAre(1, 2, 3, 4));
  EXPECT_EQ(file->metadata.at("step"), "9");

  absl::StatusOr<SafetensorsFile> missing = ReadSafetensors(dir + "/nope.safetensors");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
}

TEST(SafetensorsTest, FixtureReserializesAsF32AndReparses) {
  absl::StatusOr<SafetensorsFile> file =
      ReadSafetensors(SourceDir() + "/tests/fixtures/reference.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  absl::StatusOr<std::string> bytes = SerializeSafetensors(file->tensors, file->metadata);
  ASSERT_TRUE(bytes.ok());
  absl::StatusOr<SafetensorsFile> again = ParseSafetensors(*bytes, "again");
  ASSERT_TRUE(again.ok()) << again.status();
  for (const auto& [name, t] : file->tensors) {
    EXPECT_EQ(again->tensors.at(name).shape, t.shape);
    EXPECT_EQ(AllBits(again->tensors.at(name).data), AllBits(t.data)) << name;
  }
}

// ----- Serializer errors ---------------------------------------------------------------------

TEST(SafetensorsTest, SerializeRejectsBadTensors) {
  absl::StatusOr<std::string> r = SerializeSafetensors({{"w", math::Tensor{{2, 3}, {1, 2}}}}, {});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("tensor \"w\": shape [2, 3] has 6 elements"));

  r = SerializeSafetensors({{"w", math::Tensor{{-1}, {}}}}, {});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("negative"));

  r = SerializeSafetensors({{"__metadata__", math::Tensor{{}, {1}}}}, {});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("reserved"));

  r = SerializeSafetensors({{"bad\xff", math::Tensor{{}, {1}}}}, {});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("UTF-8"));

  r = SerializeSafetensors({}, {{"k", "\xc0\x80"}});  // overlong encoding
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
}

// ----- Reader errors -------------------------------------------------------------------------

struct ErrorCase {
  std::string name;
  std::string bytes;
  absl::StatusCode code;
  std::vector<std::string> substrings;
};

void ExpectError(const std::string& bytes, absl::StatusCode code,
                 const std::vector<std::string>& substrings) {
  absl::StatusOr<SafetensorsFile> r = ParseSafetensors(bytes, "ckpt.safetensors");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), code) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("ckpt.safetensors: ")) << r.status();
  for (const std::string& s : substrings) {
    EXPECT_THAT(r.status().message(), HasSubstr(s)) << r.status();
  }
}

// Header entry text for tensor `name`.
std::string Entry(const std::string& name, const std::string& dtype, const std::string& shape,
                  uint64_t begin, uint64_t end) {
  return absl::StrCat("\"", name, "\":{\"dtype\":\"", dtype, "\",\"shape\":", shape,
                      ",\"data_offsets\":[", begin, ",", end, "]}");
}

TEST(SafetensorsTest, TooShortFileIsDataLoss) {
  ExpectError("", absl::StatusCode::kDataLoss, {"has 0 bytes, fewer than the 8-byte"});
  ExpectError(std::string("\x02\0\0\0\0", 5), absl::StatusCode::kDataLoss, {"has 5 bytes"});
}

TEST(SafetensorsTest, HeaderLengthBeyondFileIsDataLoss) {
  ExpectError(Le64(100) + "{}", absl::StatusCode::kDataLoss,
              {"header length 100 exceeds the 2 bytes", "truncated"});
  ExpectError(Le64(~uint64_t{0}) + "{}", absl::StatusCode::kDataLoss,
              {"header length 18446744073709551615"});
}

TEST(SafetensorsTest, TruncatedDataIsDataLossNamingTensor) {
  absl::StatusOr<std::string> bytes = SerializeSafetensors(
      {{"a", math::Tensor{{2}, {1, 2}}}, {"b", math::Tensor{{3}, {1, 2, 3}}}}, {});
  ASSERT_TRUE(bytes.ok());
  const std::string cut = bytes->substr(0, bytes->size() - 1);
  ExpectError(
      cut, absl::StatusCode::kDataLoss,
      {"tensor \"b\"", "data_offsets [8, 20] extend past the end of the 19-byte", "truncated"});
  // Truncated inside the header.
  ExpectError(bytes->substr(0, 20), absl::StatusCode::kDataLoss, {"exceeds the 12 bytes"});
}

TEST(SafetensorsTest, OverlappingTensorsAreInvalid) {
  const std::string header =
      "{" + Entry("a", "F32", "[2]", 0, 8) + "," + Entry("b", "F32", "[2]", 4, 12) + "}";
  ExpectError(MakeFile(header, std::string(12, '\0')), absl::StatusCode::kInvalidArgument,
              {"tensor \"b\" [4, 12) overlaps tensor \"a\" [0, 8)"});
  // Identical ranges overlap too.
  const std::string same =
      "{" + Entry("a", "F32", "[1]", 0, 4) + "," + Entry("b", "F32", "[1]", 0, 4) + "}";
  ExpectError(MakeFile(same, std::string(4, '\0')), absl::StatusCode::kInvalidArgument,
              {"overlaps"});
}

TEST(SafetensorsTest, MislabelledShapeIsInvalid) {
  const std::string header = "{" + Entry("layers.1.weight", "F32", "[3]", 0, 8) + "}";
  ExpectError(MakeFile(header, std::string(8, '\0')), absl::StatusCode::kInvalidArgument,
              {"tensor \"layers.1.weight\"",
               "shape [3] of F32 needs 12 bytes but data_offsets [0, 8] span 8"});
  // The same bytes labelled F16 of 3 elements: 6 bytes != 8.
  const std::string f16 = "{" + Entry("h", "F16", "[3]", 0, 8) + "}";
  ExpectError(MakeFile(f16, std::string(8, '\0')), absl::StatusCode::kInvalidArgument,
              {"needs 6 bytes"});
}

TEST(SafetensorsTest, OutOfBoundsOffsetsAreDataLoss) {
  const std::string header = "{" + Entry("w", "F32", "[4]", 8, 24) + "}";
  ExpectError(MakeFile(header, std::string(16, '\0')), absl::StatusCode::kDataLoss,
              {"tensor \"w\"", "[8, 24] extend past the end of the 16-byte data buffer"});
  const std::string huge =
      "{" + Entry("w", "F32", "[1]", 18446744073709551611ull, 18446744073709551615ull) + "}";
  ExpectError(MakeFile(huge, ""), absl::StatusCode::kDataLoss, {"extend past"});
}

TEST(SafetensorsTest, BeginAfterEndIsInvalid) {
  const std::string header = "{" + Entry("w", "F32", "[0]", 8, 4) + "}";
  ExpectError(MakeFile(header, std::string(8, '\0')), absl::StatusCode::kInvalidArgument,
              {"tensor \"w\"", "[8, 4] has begin > end"});
}

TEST(SafetensorsTest, GapsAndTrailingBytesAreInvalid) {
  const std::string gap =
      "{" + Entry("a", "F32", "[1]", 0, 4) + "," + Entry("b", "F32", "[1]", 8, 12) + "}";
  ExpectError(MakeFile(gap, std::string(12, '\0')), absl::StatusCode::kInvalidArgument,
              {"bytes [4, 8) of the data buffer belong to no tensor (between \"a\" and \"b\")"});
  const std::string lead = "{" + Entry("a", "F32", "[1]", 4, 8) + "}";
  ExpectError(MakeFile(lead, std::string(8, '\0')), absl::StatusCode::kInvalidArgument,
              {"bytes [0, 4)", "before \"a\""});
  const std::string trailing = "{" + Entry("a", "F32", "[1]", 0, 4) + "}";
  ExpectError(MakeFile(trailing, std::string(7, '\0')), absl::StatusCode::kInvalidArgument,
              {"buffer has 7 bytes but the tensors cover only 4", "3 trailing bytes after \"a\""});
  ExpectError(MakeFile("{}", "x"), absl::StatusCode::kInvalidArgument, {"1 trailing bytes"});
}

TEST(SafetensorsTest, BadJsonIsInvalid) {
  ExpectError(MakeFile("{\"a\": ", ""), absl::StatusCode::kInvalidArgument,
              {"header is not valid JSON"});
  ExpectError(MakeFile("", ""), absl::StatusCode::kInvalidArgument, {"not valid JSON"});
  ExpectError(MakeFile("{} x", ""), absl::StatusCode::kInvalidArgument, {"not valid JSON"});
  ExpectError(MakeFile("[1,2]", ""), absl::StatusCode::kInvalidArgument,
              {"header is a JSON array, not an object"});
  ExpectError(MakeFile("{\"a\xff\":1}", ""), absl::StatusCode::kInvalidArgument,
              {"not valid UTF-8"});
  ExpectError(MakeFile(std::string(100, '[') + std::string(100, ']'), ""),
              absl::StatusCode::kInvalidArgument, {"nested deeper than 8"});
  // A header with a NUL byte inside.
  ExpectError(MakeFile(std::string("{\0}", 3), ""), absl::StatusCode::kInvalidArgument,
              {"not valid JSON"});
}

TEST(SafetensorsTest, MalformedEntriesAreInvalidAndNamed) {
  const std::string buf(4, '\0');
  auto file = [&](const std::string& entry_body) {
    return MakeFile("{\"t\":" + entry_body + "}", buf);
  };
  ExpectError(file("[1]"), absl::StatusCode::kInvalidArgument,
              {"tensor \"t\": entry is a JSON array, not an object"});
  ExpectError(file(R"({"dtype":"F32","shape":[1]})"), absl::StatusCode::kInvalidArgument,
              {"tensor \"t\": missing field \"data_offsets\""});
  ExpectError(file(R"({"dtype":"F32","shape":[1],"data_offsets":[0,4],"extra":1})"),
              absl::StatusCode::kInvalidArgument, {"tensor \"t\": unknown field \"extra\""});
  ExpectError(file(R"({"dtype":32,"shape":[1],"data_offsets":[0,4]})"),
              absl::StatusCode::kInvalidArgument, {"\"dtype\" is a number, not a string"});
  ExpectError(file(R"({"dtype":"F99","shape":[1],"data_offsets":[0,4]})"),
              absl::StatusCode::kInvalidArgument, {"tensor \"t\": unknown dtype \"F99\""});
  ExpectError(file(R"({"dtype":"I32","shape":[1],"data_offsets":[0,4]})"),
              absl::StatusCode::kInvalidArgument,
              {"tensor \"t\": dtype I32 is not supported (supported: F32, F16, BF16, F64)"});
  ExpectError(file(R"({"dtype":"F32","shape":4,"data_offsets":[0,4]})"),
              absl::StatusCode::kInvalidArgument, {"\"shape\" is a number, not an array"});
  ExpectError(file(R"({"dtype":"F32","shape":[-1],"data_offsets":[0,4]})"),
              absl::StatusCode::kInvalidArgument, {"tensor \"t\": shape[0] is negative (-1)"});
  ExpectError(file(R"({"dtype":"F32","shape":[1.0],"data_offsets":[0,4]})"),
              absl::StatusCode::kInvalidArgument,
              {"shape[0] is a number, not a non-negative integer"});
  ExpectError(file(R"({"dtype":"F32","shape":["1"],"data_offsets":[0,4]})"),
              absl::StatusCode::kInvalidArgument, {"shape[0] is a string"});
  ExpectError(file(R"({"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]})"),
              absl::StatusCode::kInvalidArgument, {"more elements than fit in 64 bits"});
  ExpectError(file(R"({"dtype":"F32","shape":[9223372036854775808],"data_offsets":[0,4]})"),
              absl::StatusCode::kInvalidArgument, {"too large"});
  ExpectError(file(R"({"dtype":"F32","shape":[1],"data_offsets":[0]})"),
              absl::StatusCode::kInvalidArgument, {"not an array of 1"});
  ExpectError(file(R"({"dtype":"F32","shape":[1],"data_offsets":{"a":0}})"),
              absl::StatusCode::kInvalidArgument, {"not a JSON object"});
  ExpectError(file(R"({"dtype":"F32","shape":[1],"data_offsets":[-4,0]})"),
              absl::StatusCode::kInvalidArgument, {"data_offsets[0] (begin) is negative"});
  ExpectError(file(R"({"dtype":"F32","shape":[1],"data_offsets":[0,4e0]})"),
              absl::StatusCode::kInvalidArgument, {"data_offsets[1] (end) is a number"});
}

TEST(SafetensorsTest, DuplicateKeysAreInvalid) {
  const std::string dup_tensor =
      "{" + Entry("w", "F32", "[1]", 0, 4) + "," + Entry("w", "F32", "[1]", 4, 8) + "}";
  ExpectError(MakeFile(dup_tensor, std::string(8, '\0')), absl::StatusCode::kInvalidArgument,
              {"duplicate tensor name \"w\""});
  ExpectError(MakeFile(R"({"w":{"dtype":"F32","dtype":"F16","shape":[1],"data_offsets":[0,4]}})",
                       std::string(4, '\0')),
              absl::StatusCode::kInvalidArgument, {"entry \"w\": duplicate key \"dtype\""});
  ExpectError(MakeFile(R"({"__metadata__":{"k":"a","k":"b"}})", ""),
              absl::StatusCode::kInvalidArgument, {"duplicate key \"k\""});
}

TEST(SafetensorsTest, BadMetadataIsInvalid) {
  ExpectError(MakeFile(R"({"__metadata__":{"step":3}})", ""), absl::StatusCode::kInvalidArgument,
              {"\"__metadata__\" value of \"step\" is a JSON number, not a string"});
  ExpectError(MakeFile(R"({"__metadata__":["a"]})", ""), absl::StatusCode::kInvalidArgument,
              {"\"__metadata__\" is a JSON array, not an object"});
}

TEST(SafetensorsTest, AcceptsForeignButValidLayouts) {
  // Whitespace, metadata last, unpadded header, zero-size tensors sharing an offset.
  const std::string header = R"( { "b" : {"shape":[2],"data_offsets":[0,8],"dtype":"F32"},)"
                             R"( "z1": {"dtype":"F32","shape":[0,3],"data_offsets":[8,8]},)"
                             R"( "z0": {"dtype":"F32","shape":[0],"data_offsets":[0,0]},)"
                             R"( "__metadata__": {} } )";
  absl::StatusOr<SafetensorsFile> file =
      ParseSafetensors(MakeFile(header, F32Bytes({1.5f, -2.0f})), "foreign");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_THAT(file->tensors.at("b").data, ElementsAre(1.5f, -2.0f));
  EXPECT_TRUE(file->tensors.at("z0").data.empty());
  EXPECT_THAT(file->tensors.at("z1").shape, ElementsAre(0, 3));
  EXPECT_TRUE(file->metadata.empty());
}

// Feeds random mutations and truncations of valid files to the parser: it must only ever return
// a status, and whatever it accepts must be self-consistent.
TEST(SafetensorsTest, FuzzMutationsNeverCrash) {
  std::vector<std::string> seeds;
  {
    std::map<std::string, math::Tensor> tensors;
    tensors["layers.0.weight"] = math::Tensor{{3, 2}, {1, 2, 3, 4, 5, 6}};
    tensors["layers.0.bias"] = math::Tensor{{2}, {-1, 1}};
    tensors["s"] = math::Tensor{{}, {7}};
    tensors["e"] = math::Tensor{{0, 4}, {}};
    absl::StatusOr<std::string> bytes = SerializeSafetensors(tensors, {{"step", "12"}});
    ASSERT_TRUE(bytes.ok());
    seeds.push_back(*bytes);
  }
  {
    absl::StatusOr<std::string> fixture =
        ReadFile(SourceDir() + "/tests/fixtures/reference.safetensors");
    ASSERT_TRUE(fixture.ok()) << fixture.status();
    seeds.push_back(*fixture);
  }

  std::mt19937_64 gen(12345);
  auto uniform = [&](uint64_t n) { return n == 0 ? 0 : gen() % n; };
  int accepted = 0;
  int rejected = 0;
  constexpr int kIterations = 30000;
  for (int iter = 0; iter < kIterations; ++iter) {
    std::string bytes = seeds[iter % seeds.size()];
    const uint64_t header_len = bytes.size() >= 8 ? static_cast<unsigned char>(bytes[0]) |
                                                        (static_cast<unsigned char>(bytes[1]) << 8)
                                                  : 0;
    const int mutations = 1 + static_cast<int>(uniform(4));
    for (int m = 0; m < mutations && !bytes.empty(); ++m) {
      switch (uniform(7)) {
        case 0:  // truncate
          bytes.resize(uniform(bytes.size() + 1));
          break;
        case 1:  // flip a bit anywhere
          bytes[uniform(bytes.size())] ^= static_cast<char>(1 << uniform(8));
          break;
        case 2: {  // replace a header character with a JSON-significant one
          static const char kChars[] = "{}[]\",:0123456789-.eE \\F32";
          if (header_len == 0 || bytes.size() <= 8) break;
          const size_t pos = 8 + uniform(std::min<uint64_t>(header_len, bytes.size() - 8));
          if (pos < bytes.size()) bytes[pos] = kChars[uniform(sizeof(kChars) - 1)];
          break;
        }
        case 3: {  // rewrite the header length
          const uint64_t options[] = {
              0, header_len - 1, header_len + 1, header_len + 8, bytes.size(), ~uint64_t{0}, gen()};
          const uint64_t v = options[uniform(7)];
          for (int i = 0; i < 8 && i < static_cast<int>(bytes.size()); ++i) {
            bytes[i] = static_cast<char>((v >> (8 * i)) & 0xff);
          }
          break;
        }
        case 4: {  // change a digit inside the header (offsets, shapes)
          std::vector<size_t> digits;
          for (size_t i = 8; i < std::min<size_t>(bytes.size(), 8 + header_len); ++i) {
            if (bytes[i] >= '0' && bytes[i] <= '9') digits.push_back(i);
          }
          if (!digits.empty())
            bytes[digits[uniform(digits.size())]] = static_cast<char>('0' + uniform(10));
          break;
        }
        case 5:  // insert a byte
          bytes.insert(bytes.begin() + static_cast<std::ptrdiff_t>(uniform(bytes.size() + 1)),
                       static_cast<char>(gen()));
          break;
        case 6:  // delete a byte
          bytes.erase(bytes.begin() + static_cast<std::ptrdiff_t>(uniform(bytes.size())));
          break;
      }
    }
    absl::StatusOr<SafetensorsFile> r = ParseSafetensors(bytes, "fuzz");
    if (r.ok()) {
      ++accepted;
      for (const auto& [name, t] : r->tensors) {
        ASSERT_EQ(static_cast<int64_t>(t.data.size()), math::NumElements(t.shape)) << name;
      }
    } else {
      ++rejected;
      const absl::StatusCode code = r.status().code();
      ASSERT_TRUE(code == absl::StatusCode::kDataLoss ||
                  code == absl::StatusCode::kInvalidArgument ||
                  code == absl::StatusCode::kResourceExhausted)
          << r.status();
      ASSERT_THAT(r.status().message(), HasSubstr("fuzz: "));
    }
  }
  EXPECT_EQ(accepted + rejected, kIterations);
  EXPECT_GT(rejected, kIterations / 2);  // most mutations must be caught
}

}  // namespace
}  // namespace pipetrain::io
