#include "common/io/confined_path.h"

#include <sys/stat.h>
#include <unistd.h>

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

}  // namespace
}  // namespace pipetrain::io
