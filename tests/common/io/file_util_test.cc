#include "common/io/file_util.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::io {
namespace {

using ::testing::HasSubstr;

// A fresh directory under the test temp dir.
std::string MakeTempDir() {
  std::string pattern = ::testing::TempDir() + "/pipetrain_file_util_XXXXXX";
  char* dir = ::mkdtemp(pattern.data());
  EXPECT_NE(dir, nullptr);
  return pattern;
}

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return names;
  while (dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(d);
  return names;
}

// Gzip-compresses `data` (one gzip member) with zlib.
std::string Gzip(const std::string& data) {
  z_stream zs{};
  EXPECT_EQ(
      deflateInit2(&zs, Z_BEST_COMPRESSION, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY),
      Z_OK);
  std::string out(deflateBound(&zs, data.size()) + 64, '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  zs.avail_in = static_cast<uInt>(data.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&zs, Z_FINISH), Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

TEST(FileUtilTest, WriteThenReadRoundTripsAndOverwrites) {
  const std::string dir = MakeTempDir();
  const std::string path = dir + "/a.bin";
  std::string contents("hello\0world", 11);
  ASSERT_TRUE(WriteFileAtomically(path, contents).ok());
  absl::StatusOr<std::string> read = ReadFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, contents);

  ASSERT_TRUE(WriteFileAtomically(path, "second").ok());
  read = ReadFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, "second");
  // No temporary files are left behind.
  EXPECT_THAT(ListDir(dir), ::testing::ElementsAre("a.bin"));
}

TEST(FileUtilTest, WritesEmptyAndLargeFiles) {
  const std::string dir = MakeTempDir();
  ASSERT_TRUE(WriteFileAtomically(dir + "/empty", "").ok());
  absl::StatusOr<std::string> read = ReadFile(dir + "/empty");
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(*read, "");

  std::string big(3 * 1000 * 1000 + 7, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>((i * 131 + 7) % 251);
  ASSERT_TRUE(WriteFileAtomically(dir + "/big", big).ok());
  read = ReadFile(dir + "/big");
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(*read, big);
}

TEST(FileUtilTest, NewFileHasUmaskMode) {
  const std::string dir = MakeTempDir();
  ASSERT_TRUE(WriteFileAtomically(dir + "/m", "x").ok());
  const mode_t mask = ::umask(0);
  ::umask(mask);
  struct stat st;
  ASSERT_EQ(::stat((dir + "/m").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0666 & ~mask);
}

TEST(FileUtilTest, ReadMissingFileIsNotFound) {
  const std::string path = MakeTempDir() + "/missing.txt";
  absl::StatusOr<std::string> read = ReadFile(path);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(read.status().message(), HasSubstr(path));
  EXPECT_THAT(read.status().message(), HasSubstr("No such file"));
}

TEST(FileUtilTest, ReadDirectoryFails) {
  const std::string dir = MakeTempDir();
  absl::StatusOr<std::string> read = ReadFile(dir);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(read.status().message(), HasSubstr("is a directory"));
}

TEST(FileUtilTest, ReadOverLimitIsResourceExhausted) {
  const std::string path = MakeTempDir() + "/f";
  ASSERT_TRUE(WriteFileAtomically(path, "0123456789").ok());
  absl::StatusOr<std::string> read = ReadFile(path, 9);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(ReadFile(path, 10).ok());
}

TEST(FileUtilTest, WriteIntoMissingDirectoryNamesPath) {
  const std::string path = MakeTempDir() + "/no/such/dir/file";
  absl::Status s = WriteFileAtomically(path, "x");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("/no/such/dir/file"));
  EXPECT_THAT(s.message(), HasSubstr("No such file"));
}

TEST(FileUtilTest, WriteOverDirectoryFailsAndCleansUp) {
  const std::string dir = MakeTempDir();
  ASSERT_EQ(::mkdir((dir + "/sub").c_str(), 0777), 0);
  ASSERT_TRUE(WriteFileAtomically(dir + "/sub/inner", "keep").ok());
  absl::Status s = WriteFileAtomically(dir + "/sub", "x");  // rename over a non-empty dir
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr(dir + "/sub"));
  EXPECT_THAT(ListDir(dir), ::testing::ElementsAre("sub"));  // temp file removed
  EXPECT_EQ(*ReadFile(dir + "/sub/inner"), "keep");
}

TEST(FileUtilTest, RejectsDirectoryLikePath) {
  EXPECT_EQ(WriteFileAtomically("", "x").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteFileAtomically("dir/", "x").code(), absl::StatusCode::kInvalidArgument);
}

TEST(FileUtilTest, EnsureDirectoryCreatesParentsAndIsIdempotent) {
  const std::string dir = MakeTempDir();
  const std::string nested = dir + "/a/b/c";
  ASSERT_TRUE(EnsureDirectory(nested).ok());
  struct stat st;
  ASSERT_EQ(::stat(nested.c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_TRUE(EnsureDirectory(nested).ok());
  EXPECT_TRUE(EnsureDirectory(nested + "/").ok());

  ASSERT_TRUE(WriteFileAtomically(dir + "/file", "x").ok());
  absl::Status s = EnsureDirectory(dir + "/file");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("not a directory"));
  s = EnsureDirectory(dir + "/file/below");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
}

TEST(FileUtilTest, DirNameAndJoinPath) {
  EXPECT_EQ(DirName("a/b/c.txt"), "a/b");
  EXPECT_EQ(DirName("c.txt"), ".");
  EXPECT_EQ(DirName("/c.txt"), "/");
  EXPECT_EQ(DirName("/x//c.txt"), "/x");
  EXPECT_EQ(JoinPath("a", "b"), "a/b");
  EXPECT_EQ(JoinPath("a/", "b"), "a/b");
  EXPECT_EQ(JoinPath("a", "/b"), "a/b");
  EXPECT_EQ(JoinPath("", "b"), "b");
}

TEST(FileUtilTest, ReadsPlainAndGzippedFiles) {
  const std::string dir = MakeTempDir();
  std::string text;
  for (int i = 0; i < 5000; ++i) text += "line " + std::to_string(i) + "\n";
  ASSERT_TRUE(WriteFileAtomically(dir + "/plain", text).ok());
  ASSERT_TRUE(WriteFileAtomically(dir + "/one.gz", Gzip(text)).ok());
  // Two concatenated gzip members decompress to the concatenation.
  ASSERT_TRUE(WriteFileAtomically(dir + "/two.gz", Gzip("abc") + Gzip(text)).ok());

  absl::StatusOr<std::string> r = ReadFileMaybeGzipped(dir + "/plain");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, text);
  r = ReadFileMaybeGzipped(dir + "/one.gz");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, text);
  r = ReadFileMaybeGzipped(dir + "/two.gz");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, "abc" + text);

  r = ReadFileMaybeGzipped(dir + "/one.gz", 100);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(FileUtilTest, TruncatedOrCorruptGzipIsDataLoss) {
  const std::string dir = MakeTempDir();
  std::string text(100000, 'q');
  for (size_t i = 0; i < text.size(); i += 7) text[i] = static_cast<char>('a' + i % 26);
  const std::string gz = Gzip(text);
  ASSERT_TRUE(WriteFileAtomically(dir + "/cut.gz", gz.substr(0, gz.size() / 2)).ok());
  absl::StatusOr<std::string> r = ReadFileMaybeGzipped(dir + "/cut.gz");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(r.status().message(), HasSubstr("truncated"));
  EXPECT_THAT(r.status().message(), HasSubstr("cut.gz"));

  std::string bad = gz;
  for (size_t i = 20; i < 40; ++i) bad[i] = static_cast<char>(bad[i] ^ 0x5a);
  ASSERT_TRUE(WriteFileAtomically(dir + "/bad.gz", bad).ok());
  r = ReadFileMaybeGzipped(dir + "/bad.gz");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(r.status().message(), HasSubstr("bad.gz"));
}

// A NUL byte ends a path for the system calls, so "dir\0x" would silently mean "dir": every path
// with one is INVALID_ARGUMENT, before anything is opened or written.
TEST(FileUtilTest, PathsWithANulByteAreInvalidArgument) {
  const std::string dir = MakeTempDir();
  ASSERT_TRUE(WriteFileAtomically(dir + "/f", "data").ok());
  const std::string nul = dir + "/f" + std::string(1, '\0') + ".bak";
  for (const absl::Status& s : {ReadFile(nul).status(), ReadFileMaybeGzipped(nul).status(),
                                WriteFileAtomically(dir + std::string(1, '\0') + "/g", "x"),
                                EnsureDirectory(dir + "/sub" + std::string(1, '\0') + "x")}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(s.message(), HasSubstr("path contains a NUL byte")) << s;
  }
  EXPECT_THAT(ReadFile(nul).status().message(), HasSubstr("/f\\000.bak'"));
  EXPECT_EQ(*ReadFile(dir + "/f"), "data");  // unchanged
}

}  // namespace
}  // namespace pipetrain::io
