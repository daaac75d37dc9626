// ReadInputFile: only regular files, checked against the size limit before they are read.
#include "common/io/input_file.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "common/io/file_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::io {
namespace {

using ::testing::HasSubstr;

std::string TempDir() {
  std::string pattern = ::testing::TempDir() + "/pipetrain_input_file_XXXXXX";
  EXPECT_NE(::mkdtemp(pattern.data()), nullptr);
  return pattern;
}

absl::StatusOr<std::string> Read(const std::string& path, int64_t max_bytes,
                                 InputCompression c = InputCompression::kNone) {
  return ReadInputFile("test file", path, max_bytes, c);
}

TEST(ReadInputFileTest, ReadsARegularFileUpToTheLimit) {
  const std::string path = TempDir() + "/a.txt";
  ASSERT_TRUE(WriteFileAtomically(path, "hello").ok());
  absl::StatusOr<std::string> s = Read(path, 5);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(*s, "hello");
  // Through a symbolic link too.
  const std::string link = path + ".link";
  ASSERT_EQ(::symlink(path.c_str(), link.c_str()), 0);
  s = Read(link, 5);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(*s, "hello");
}

TEST(ReadInputFileTest, RefusesWhatIsNotARegularFile) {
  absl::StatusOr<std::string> s = Read("/dev/zero", 100);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.status().message(),
            "test file: '/dev/zero' is a character device, not a regular file");
  const std::string dir = TempDir();
  s = Read(dir, 100);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("'" + dir + "' is a directory"));
  // A FIFO with no writer: refused at once (opening it would block).
  const std::string fifo = dir + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  s = Read(fifo, 100);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("'" + fifo + "' is a FIFO"));
  s = Read(dir + "/missing", 100);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.status().message(), HasSubstr("test file: cannot read '" + dir + "/missing'"));
}

TEST(ReadInputFileTest, RefusesAFileOverTheLimitBeforeReadingIt) {
  const std::string path = TempDir() + "/big";
  ASSERT_TRUE(WriteFileAtomically(path, "").ok());
  ASSERT_EQ(::truncate(path.c_str(), int64_t{1} << 40), 0);  // sparse: 1 TiB of holes
  absl::StatusOr<std::string> s = Read(path, 1000);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.status().message(),
            absl::StrCat("test file: '", path,
                         "' has 1099511627776 bytes, more than the limit of 1000 bytes"));
}

TEST(ReadInputFileTest, LimitsTheDecompressedSizeOfAGzipFile) {
  const std::string path = TempDir() + "/zeros.gz";
  const std::string zeros(100000, '0');
  gzFile gz = gzopen(path.c_str(), "wb");
  ASSERT_NE(gz, nullptr);
  ASSERT_EQ(gzwrite(gz, zeros.data(), static_cast<unsigned>(zeros.size())),
            static_cast<int>(zeros.size()));
  ASSERT_EQ(gzclose(gz), Z_OK);
  absl::StatusOr<std::string> s = Read(path, 1000, InputCompression::kGzipDetected);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.status().message(), HasSubstr("larger than the limit of 1000 bytes"));
  s = Read(path, 100000, InputCompression::kGzipDetected);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(*s, zeros);
  // Without decompression the compressed bytes come back as they are.
  s = Read(path, 100000);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_LT(s->size(), 1000u);
}

}  // namespace
}  // namespace pipetrain::io
