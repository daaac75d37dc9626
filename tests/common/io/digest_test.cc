#include "common/io/digest.h"

#include <stdlib.h>

#include <string>

#include "common/io/file_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::io {
namespace {

using ::testing::HasSubstr;

std::string MakeTempDir() {
  std::string pattern = ::testing::TempDir() + "/pipetrain_digest_XXXXXX";
  EXPECT_NE(::mkdtemp(pattern.data()), nullptr);
  return pattern;
}

// FIPS 180-2 test vectors.
TEST(DigestTest, KnownVectors) {
  absl::StatusOr<FileDigest> empty = DigestBytes("");
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->sha256, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(empty->bytes, 0);
  absl::StatusOr<FileDigest> abc = DigestBytes("abc");
  ASSERT_TRUE(abc.ok()) << abc.status();
  EXPECT_EQ(abc->sha256, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(abc->bytes, 3);
  absl::StatusOr<FileDigest> two_blocks =
      DigestBytes("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq");
  ASSERT_TRUE(two_blocks.ok());
  EXPECT_EQ(two_blocks->sha256, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

// A file read in several blocks gives the digest of its bytes taken whole.
TEST(DigestTest, FileDigestEqualsBytesDigest) {
  const std::string dir = MakeTempDir();
  std::string contents;
  for (int i = 0; i < 200000; ++i) contents.push_back(static_cast<char>(i * 7 + i / 256));
  ASSERT_TRUE(WriteFileAtomically(dir + "/f", contents).ok());
  absl::StatusOr<FileDigest> file = DigestFile(dir + "/f");
  ASSERT_TRUE(file.ok()) << file.status();
  absl::StatusOr<FileDigest> bytes = DigestBytes(contents);
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(file->sha256, bytes->sha256);
  EXPECT_EQ(file->bytes, 200000);
  EXPECT_TRUE(IsSha256Hex(file->sha256));

  absl::StatusOr<FileDigest> missing = DigestFile(dir + "/nope");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr(dir + "/nope"));
  EXPECT_EQ(DigestFile(dir).status().code(), absl::StatusCode::kFailedPrecondition);
}

// Bytes given in pieces of any size, a file of several read blocks among them, digest as the
// whole: the stream the coordinator digests uploads with as they arrive.
TEST(DigestTest, StreamDigestEqualsBytesDigestForAnySplit) {
  std::string contents;
  for (int i = 0; i < (1 << 20) + 4097; ++i) contents.push_back(static_cast<char>(i * 13 + 5));
  absl::StatusOr<FileDigest> whole = DigestBytes(contents);
  ASSERT_TRUE(whole.ok());
  for (size_t piece : {size_t{1} << 20, size_t{4096}, size_t{777}}) {
    Sha256Stream stream;
    for (size_t at = 0; at < contents.size(); at += piece) {
      ASSERT_TRUE(stream.Update(absl::string_view(contents).substr(at, piece)).ok());
    }
    absl::StatusOr<FileDigest> streamed = stream.Finish();
    ASSERT_TRUE(streamed.ok()) << streamed.status();
    EXPECT_EQ(streamed->sha256, whole->sha256) << piece;
    EXPECT_EQ(streamed->bytes, static_cast<int64_t>(contents.size()));
    EXPECT_EQ(stream.Finish().status().code(), absl::StatusCode::kFailedPrecondition);
  }
  Sha256Stream empty;
  EXPECT_EQ(empty.Finish()->sha256, DigestBytes("")->sha256);
  const std::string dir = MakeTempDir();
  ASSERT_TRUE(WriteFileAtomically(dir + "/big", contents).ok());
  absl::StatusOr<FileDigest> file = DigestFile(dir + "/big");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->sha256, whole->sha256);
}

TEST(DigestTest, IsSha256HexAcceptsOnlyLowercaseHexOfLength64) {
  const std::string good(64, 'a');
  EXPECT_TRUE(IsSha256Hex(good));
  EXPECT_TRUE(IsSha256Hex(std::string(64, '0')));
  EXPECT_FALSE(IsSha256Hex(std::string(63, 'a')));
  EXPECT_FALSE(IsSha256Hex(std::string(65, 'a')));
  EXPECT_FALSE(IsSha256Hex(std::string(64, 'A')));
  EXPECT_FALSE(IsSha256Hex(std::string(64, 'g')));
  EXPECT_FALSE(IsSha256Hex(""));
}

}  // namespace
}  // namespace pipetrain::io
