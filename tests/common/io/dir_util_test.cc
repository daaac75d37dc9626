#include "common/io/dir_util.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "common/io/file_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::io {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

std::string MakeTempDir() {
  std::string pattern = ::testing::TempDir() + "/pipetrain_dir_util_XXXXXX";
  EXPECT_NE(::mkdtemp(pattern.data()), nullptr);
  return pattern;
}

std::vector<std::string> Names(const std::string& dir) {
  absl::StatusOr<std::vector<std::string>> names = ListDirectory(dir);
  EXPECT_TRUE(names.ok()) << names.status();
  return names.ok() ? *names : std::vector<std::string>{};
}

std::string Contents(const std::string& path) {
  absl::StatusOr<std::string> s = ReadFile(path);
  return s.ok() ? *s : "<" + s.status().ToString() + ">";
}

TEST(DirUtilTest, ListDirectoryIsSortedAndNamesErrors) {
  const std::string dir = MakeTempDir();
  for (const char* name : {"b", "a", "c.d"}) {
    ASSERT_TRUE(WriteFileAtomically(JoinPath(dir, name), "x").ok());
  }
  ASSERT_TRUE(EnsureDirectory(dir + "/sub").ok());
  EXPECT_THAT(Names(dir), ElementsAre("a", "b", "c.d", "sub"));
  EXPECT_THAT(Names(dir + "/sub"), IsEmpty());

  absl::StatusOr<std::vector<std::string>> missing = ListDirectory(dir + "/nope");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr(dir + "/nope"));
  EXPECT_EQ(ListDirectory(dir + "/a").status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(DirUtilTest, RemoveTreeRemovesEverythingButFollowsNoLink) {
  const std::string dir = MakeTempDir();
  const std::string tree = dir + "/tree";
  ASSERT_TRUE(EnsureDirectory(tree + "/x/y").ok());
  ASSERT_TRUE(WriteFileAtomically(tree + "/x/y/f", "1").ok());
  ASSERT_TRUE(WriteFileAtomically(tree + "/g", "2").ok());
  ASSERT_TRUE(EnsureDirectory(dir + "/outside").ok());
  ASSERT_TRUE(WriteFileAtomically(dir + "/outside/keep", "3").ok());
  ASSERT_EQ(::symlink((dir + "/outside").c_str(), (tree + "/link").c_str()), 0);

  ASSERT_TRUE(RemoveTree(tree).ok());
  EXPECT_THAT(Names(dir), ElementsAre("outside"));
  EXPECT_EQ(Contents(dir + "/outside/keep"), "3");
  EXPECT_TRUE(RemoveTree(tree).ok());  // already gone
}

TEST(DirUtilTest, StagingDirectoriesAreFreshSiblings) {
  const std::string dir = MakeTempDir();
  const std::string target = dir + "/ckpt";
  absl::StatusOr<std::string> a = CreateStagingDirectory(target);
  absl::StatusOr<std::string> b = CreateStagingDirectory(target + "/");  // same target
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_NE(*a, *b);
  EXPECT_EQ(DirName(*a), dir);
  EXPECT_THAT(*a, HasSubstr(target + ".tmp-" + std::to_string(::getpid()) + "-"));
  EXPECT_THAT(Names(*a), IsEmpty());
  EXPECT_EQ(StagingTarget(a->substr(dir.size() + 1)), "ckpt");
  EXPECT_EQ(StagingTarget(b->substr(dir.size() + 1)), "ckpt");
  // The target itself is not created.
  EXPECT_EQ(Names(dir).size(), 2u);

  EXPECT_EQ(CreateStagingDirectory("").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateStagingDirectory("/").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateStagingDirectory(dir + "/..").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateStagingDirectory(dir + "/no/such").status().code(), absl::StatusCode::kNotFound);
}

TEST(DirUtilTest, StagingTargetParsesOnlyStagingNames) {
  EXPECT_EQ(StagingTarget("step-000000000001.tmp-42-00ff00ff00ff00ff"), "step-000000000001");
  EXPECT_EQ(StagingTarget("a.tmp-b.tmp-1-0123456789abcdef"), "a.tmp-b");
  EXPECT_EQ(StagingTarget("ckpt"), "");
  EXPECT_EQ(StagingTarget(".tmp-1-0123456789abcdef"), "");
  EXPECT_EQ(StagingTarget("a.tmp--0123456789abcdef"), "");
  EXPECT_EQ(StagingTarget("a.tmp-x-0123456789abcdef"), "");
  EXPECT_EQ(StagingTarget("a.tmp-1-0123456789abcde"), "");
  EXPECT_EQ(StagingTarget("a.tmp-1-0123456789abcdeg"), "");
  // WriteFileAtomically's temporaries are not staging directories.
  EXPECT_EQ(StagingTarget("manifest.json.tmp.42.123456.0"), "");
}

TEST(DirUtilTest, PublishRenamesIntoAMissingDirectory) {
  const std::string dir = MakeTempDir();
  const std::string target = dir + "/out";
  absl::StatusOr<std::string> staging = CreateStagingDirectory(target);
  ASSERT_TRUE(staging.ok());
  ASSERT_TRUE(WriteFileAtomically(*staging + "/new", "N").ok());
  ASSERT_TRUE(PublishDirectory(*staging, target).ok());
  EXPECT_THAT(Names(dir), ElementsAre("out"));
  EXPECT_THAT(Names(target), ElementsAre("new"));
  EXPECT_EQ(Contents(target + "/new"), "N");
}

// An existing directory is swapped whole: none of its old entries survive, nothing is left
// beside it.
TEST(DirUtilTest, PublishReplacesAnExistingDirectoryWhole) {
  const std::string dir = MakeTempDir();
  const std::string target = dir + "/out";
  ASSERT_TRUE(EnsureDirectory(target + "/old-sub").ok());
  ASSERT_TRUE(WriteFileAtomically(target + "/old", "O").ok());
  ASSERT_TRUE(WriteFileAtomically(target + "/both", "old").ok());
  absl::StatusOr<std::string> staging = CreateStagingDirectory(target);
  ASSERT_TRUE(staging.ok());
  ASSERT_TRUE(WriteFileAtomically(*staging + "/both", "new").ok());
  ASSERT_TRUE(WriteFileAtomically(*staging + "/new", "N").ok());

  // Until published, the target is untouched (a crash here leaves the old directory).
  EXPECT_THAT(Names(target), ElementsAre("both", "old", "old-sub"));
  ASSERT_TRUE(PublishDirectory(*staging, target).ok());
  EXPECT_THAT(Names(dir), ElementsAre("out"));
  EXPECT_THAT(Names(target), ElementsAre("both", "new"));
  EXPECT_EQ(Contents(target + "/both"), "new");
}

TEST(DirUtilTest, PublishOntoAFileFailsAndChangesNothing) {
  const std::string dir = MakeTempDir();
  const std::string target = dir + "/out";
  ASSERT_TRUE(WriteFileAtomically(target, "file").ok());
  absl::StatusOr<std::string> staging = CreateStagingDirectory(target);
  ASSERT_TRUE(staging.ok());
  absl::Status s = PublishDirectory(*staging, target);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("'" + target + "' exists and is not a directory"));
  EXPECT_EQ(Contents(target), "file");
  EXPECT_THAT(Names(*staging), IsEmpty());
}

TEST(DirUtilTest, RemoveDirectoryAtomicallyLeavesNothing) {
  const std::string dir = MakeTempDir();
  ASSERT_TRUE(EnsureDirectory(dir + "/victim/sub").ok());
  ASSERT_TRUE(WriteFileAtomically(dir + "/victim/sub/f", "x").ok());
  ASSERT_TRUE(WriteFileAtomically(dir + "/keep", "k").ok());
  ASSERT_TRUE(RemoveDirectoryAtomically(dir + "/victim").ok());
  EXPECT_THAT(Names(dir), ElementsAre("keep"));
  EXPECT_TRUE(RemoveDirectoryAtomically(dir + "/victim").ok());
}

TEST(DirUtilTest, CheckWritableDirectoryCreatesAndLeavesNoProbe) {
  const std::string dir = MakeTempDir();
  ASSERT_TRUE(CheckWritableDirectory(dir + "/a/b").ok());
  EXPECT_THAT(Names(dir + "/a/b"), IsEmpty());
  ASSERT_TRUE(CheckWritableDirectory(dir + "/a/b").ok());
  EXPECT_THAT(Names(dir + "/a/b"), IsEmpty());
}

TEST(DirUtilTest, CheckWritableDirectoryRefusesFiles) {
  const std::string dir = MakeTempDir();
  ASSERT_TRUE(WriteFileAtomically(dir + "/f", "x").ok());
  absl::Status s = CheckWritableDirectory(dir + "/f");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr(dir + "/f"));
  s = CheckWritableDirectory(dir + "/f/sub");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr(dir + "/f"));
}

// A directory the process may not write to is PERMISSION_DENIED naming it. Root may write
// anywhere, so as root the check runs in a child that dropped to an unprivileged user.
TEST(DirUtilTest, CheckWritableDirectoryReportsPermissionDenied) {
  const std::string dir = MakeTempDir();
  const std::string locked = dir + "/locked";
  ASSERT_TRUE(EnsureDirectory(locked).ok());
  ASSERT_EQ(::chmod(dir.c_str(), 0755), 0);
  ASSERT_EQ(::chmod(locked.c_str(), 0555), 0);
  auto check = [&]() -> bool {
    const absl::Status in = CheckWritableDirectory(locked);
    const absl::Status below = CheckWritableDirectory(locked + "/sub");
    return in.code() == absl::StatusCode::kPermissionDenied &&
           absl::StrContains(in.message(), locked) &&
           below.code() == absl::StatusCode::kPermissionDenied &&
           absl::StrContains(below.message(), locked + "/sub");
  };
  if (::geteuid() != 0) {
    EXPECT_TRUE(check());
  } else {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      // nobody:nogroup
      if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(2);
      ::_exit(check() ? 0 : 1);
    }
    int wstatus = 0;
    ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
    ASSERT_TRUE(WIFEXITED(wstatus));
    EXPECT_EQ(WEXITSTATUS(wstatus), 0);
  }
  ASSERT_EQ(::chmod(locked.c_str(), 0755), 0);
}

TEST(DirUtilTest, PathsWithANulByteAreInvalidArgument) {
  const std::string dir = MakeTempDir();
  const std::string nul = dir + std::string(1, '\0') + "x";
  for (const absl::Status& s :
       {SyncDirectory(nul), ListDirectory(nul).status(), RemoveTree(nul),
        CreateStagingDirectory(nul).status(), PublishDirectory(nul, dir + "/p"),
        PublishDirectory(dir + "/p", nul), RemoveDirectoryAtomically(nul),
        CheckWritableDirectory(nul)}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(s.message(), HasSubstr("path contains a NUL byte")) << s;
  }
  EXPECT_TRUE(Names(dir).empty());
}

}  // namespace
}  // namespace pipetrain::io
