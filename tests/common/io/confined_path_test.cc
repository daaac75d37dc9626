#include "common/io/confined_path.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::io {
namespace {

using ::testing::HasSubstr;

class ConfinedPathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/confined_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    char buf[4096];
    ASSERT_NE(realpath(tmpl.c_str(), buf), nullptr);
    base_ = buf;
    root_ = base_ + "/root";
    ASSERT_EQ(mkdir(root_.c_str(), 0755), 0);
    ASSERT_EQ(mkdir((base_ + "/outside").c_str(), 0755), 0);
  }
  std::string base_, root_;
};

TEST_F(ConfinedPathTest, PathsUnderTheRootAreNormalised) {
  EXPECT_EQ(*ConfinePath(root_, root_ + "/ckpt"), root_ + "/ckpt");
  EXPECT_EQ(*ConfinePath(root_, root_ + "//a/./b/../ckpt/"), root_ + "/a/ckpt");
  EXPECT_EQ(*ConfinePath(root_, "job/ckpt"), root_ + "/job/ckpt");
  EXPECT_EQ(*ConfinePath(root_, root_), root_);
  EXPECT_EQ(*ConfinePath("/", "/anything/at/all"), "/anything/at/all");
}

TEST_F(ConfinedPathTest, EscapesArePermissionDenied) {
  for (const std::string& bad :
       {base_ + "/outside/ckpt", root_ + "/../outside", std::string("../outside"), root_ + "x/ckpt",
        std::string("/etc/passwd"), std::string("/../../etc")}) {
    const absl::StatusOr<std::string> p = ConfinePath(root_, bad);
    ASSERT_EQ(p.status().code(), absl::StatusCode::kPermissionDenied) << bad;
    EXPECT_THAT(p.status().message(), HasSubstr("outside the checkpoint root " + root_)) << bad;
  }
}

TEST_F(ConfinedPathTest, SymbolicLinksCannotLeadOutside) {
  ASSERT_EQ(symlink((base_ + "/outside").c_str(), (root_ + "/door").c_str()), 0);
  EXPECT_EQ(ConfinePath(root_, root_ + "/door/ckpt").status().code(),
            absl::StatusCode::kPermissionDenied);
  // A root reached through a link is fine, in either spelling.
  ASSERT_EQ(symlink(root_.c_str(), (base_ + "/alias").c_str()), 0);
  EXPECT_EQ(*ConfinePath(base_ + "/alias", base_ + "/alias/ckpt"), base_ + "/alias/ckpt");
  EXPECT_EQ(*ConfinePath(base_ + "/alias", root_ + "/ckpt"), root_ + "/ckpt");
}

TEST_F(ConfinedPathTest, BadRootOrEmptyPathIsInvalidArgument) {
  EXPECT_EQ(ConfinePath(root_, "").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ConfinePath(base_ + "/missing", "x").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ConfinePath("", "x").status().code(), absl::StatusCode::kInvalidArgument);
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
}

TEST_F(ConfinedPathTest, ConfinedFilesAreReadInsideTheDirectoryOnly) {
  WriteText(root_ + "/inside", "in");
  WriteText(base_ + "/outside/secret", "out");
  EXPECT_EQ(*ReadConfinedFile(root_, "inside"), "in");
  // A link to a file inside is followed, relative or absolute.
  ASSERT_EQ(symlink("inside", (root_ + "/near").c_str()), 0);
  ASSERT_EQ(symlink((root_ + "/inside").c_str(), (root_ + "/near_abs").c_str()), 0);
  EXPECT_EQ(*ReadConfinedFile(root_, "near"), "in");
  EXPECT_EQ(*ReadConfinedFile(root_, "near_abs"), "in");
  // Links leading out, directly, through "..", or through a chain of links, are refused.
  ASSERT_EQ(symlink((base_ + "/outside/secret").c_str(), (root_ + "/far").c_str()), 0);
  ASSERT_EQ(symlink("../outside/secret", (root_ + "/up").c_str()), 0);
  ASSERT_EQ(symlink("far", (root_ + "/chain").c_str()), 0);
  for (const std::string name : {"far", "up", "chain"}) {
    const absl::StatusOr<std::string> read = ReadConfinedFile(root_, name);
    ASSERT_EQ(read.status().code(), absl::StatusCode::kPermissionDenied) << name;
    EXPECT_THAT(read.status().message(),
                HasSubstr("'" + root_ + "/" + name + "' leads to '" + base_ +
                          "/outside/secret', outside the "
                          "directory " +
                          root_));
  }
  // A directory reached through a link still confines to its real path.
  ASSERT_EQ(symlink(root_.c_str(), (base_ + "/alias").c_str()), 0);
  EXPECT_EQ(*ReadConfinedFile(base_ + "/alias", "near"), "in");
  EXPECT_EQ(ReadConfinedFile(base_ + "/alias", "far").status().code(),
            absl::StatusCode::kPermissionDenied);
}

TEST_F(ConfinedPathTest, ConfinedOpenRefusesWhatIsNotAPlainRegularFile) {
  WriteText(root_ + "/file", "x");
  for (const std::string name : {"", ".", "..", "a/file", "/etc/passwd"}) {
    EXPECT_EQ(OpenConfinedFile(root_, name).status().code(), absl::StatusCode::kInvalidArgument)
        << name;
  }
  EXPECT_EQ(OpenConfinedFile(root_, "missing").status().code(), absl::StatusCode::kNotFound);
  ASSERT_EQ(mkdir((root_ + "/sub").c_str(), 0755), 0);
  EXPECT_EQ(OpenConfinedFile(root_, "sub").status().code(), absl::StatusCode::kFailedPrecondition);
  // A FIFO is refused without blocking on it.
  ASSERT_EQ(mkfifo((root_ + "/fifo").c_str(), 0600), 0);
  const absl::StatusOr<int> fifo = OpenConfinedFile(root_, "fifo");
  EXPECT_EQ(fifo.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(fifo.status().message(), HasSubstr("is not a regular file"));
  // The descriptor is the caller's, open for reading, blocking.
  const absl::StatusOr<int> fd = OpenConfinedFile(root_, "file");
  ASSERT_TRUE(fd.ok()) << fd.status();
  EXPECT_EQ(fcntl(*fd, F_GETFL) & (O_NONBLOCK | O_ACCMODE), O_RDONLY);
  char c = 0;
  EXPECT_EQ(read(*fd, &c, 1), 1);
  EXPECT_EQ(c, 'x');
  EXPECT_EQ(close(*fd), 0);
  EXPECT_EQ(ReadConfinedFile(root_, "file", 0).status().code(),
            absl::StatusCode::kResourceExhausted);
}

// Before: "ckpt\0x" passed (realpath saw only "ckpt") and the coordinator later failed with "Is
// a directory (the checkpoint was abandoned?)".
TEST_F(ConfinedPathTest, PathsWithANulByteAreInvalidArgument) {
  const std::string nul(1, '\0');
  for (const absl::Status& s : {ConfinePath(root_, "ckpt" + nul + "x").status(),
                                ConfinePath(root_, root_ + "/ckpt" + nul).status(),
                                ConfinePath(root_ + nul + "x", "ckpt").status(),
                                OpenConfinedFile(root_, "file" + nul + "x").status(),
                                OpenConfinedFile(root_ + nul, "file").status()}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(s.message(), HasSubstr("path contains a NUL byte")) << s;
  }
}

}  // namespace
}  // namespace pipetrain::io
