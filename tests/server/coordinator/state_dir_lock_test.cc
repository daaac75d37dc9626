#include "server/coordinator/state_dir_lock.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/io/dir_util.h"
#include "common/io/file_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::coordinator {
namespace {

using ::testing::HasSubstr;

class StateDirLockTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char templ[] = "/tmp/pipetrain_state_lock_XXXXXX";
    ASSERT_NE(mkdtemp(templ), nullptr);
    dir_ = templ;
    state_ = dir_ + "/state";
  }
  void TearDown() override { ASSERT_TRUE(io::RemoveTree(dir_).ok()); }

  static std::string Host() {
    char name[256] = {};
    gethostname(name, sizeof(name) - 1);
    return name;
  }

  std::string LockFile() const { return state_ + "/coordinator.lock"; }

  std::string dir_;
  std::string state_;
};

// Two acquisitions through two open file descriptions of one process conflict as two processes
// would: the second is refused, naming the holder, until the first is released.
TEST_F(StateDirLockTest, ASecondAcquisitionIsRefusedNamingTheHolder) {
  absl::StatusOr<std::unique_ptr<StateDirLock>> first =
      StateDirLock::Acquire(state_, "127.0.0.1:0");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ((*first)->path(), LockFile());
  ASSERT_TRUE((*first)->SetAddress("127.0.0.1:7070").ok());
  absl::StatusOr<std::unique_ptr<StateDirLock>> second = StateDirLock::Acquire(state_, "x:1");
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition) << second.status();
  EXPECT_EQ(
      second.status().message(),
      absl::StrCat("state directory ", state_, " is in use by another coordinator (pid ", getpid(),
                   " on host ", Host(), ", serving on 127.0.0.1:7070; lock file ", LockFile(),
                   "): one coordinator per state directory; stop that one first, or give "
                   "this one its own state directory"));
  first->reset();
  absl::StatusOr<std::unique_ptr<StateDirLock>> third = StateDirLock::Acquire(state_, "x:1");
  ASSERT_TRUE(third.ok()) << third.status();
  absl::StatusOr<std::string> record = io::ReadFile(LockFile());
  ASSERT_TRUE(record.ok());
  EXPECT_EQ(*record, absl::StrCat("pid ", getpid(), "\nhost ", Host(), "\naddress x:1\n"));
}

// The kernel drops a dead process's lock: its lock file, still naming it, blocks nobody.
TEST_F(StateDirLockTest, ALockFileLeftByAKilledProcessDoesNotBlock) {
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(ready[0]);
    absl::StatusOr<std::unique_ptr<StateDirLock>> held =
        StateDirLock::Acquire(state_, "127.0.0.1:7070");
    const char byte = held.ok() ? '1' : '0';
    if (write(ready[1], &byte, 1) != 1) _exit(1);
    for (;;) pause();  // holds the lock until killed.
  }
  close(ready[1]);
  // The child is killed on every way out of the test.
  struct Reaper {
    pid_t pid;
    ~Reaper() {
      if (pid <= 0) return;
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  } reaper{child};
  char byte = 0;
  ASSERT_EQ(read(ready[0], &byte, 1), 1);  // the child wrote, or died (0: end of file).
  close(ready[0]);
  ASSERT_EQ(byte, '1');
  absl::StatusOr<std::unique_ptr<StateDirLock>> refused = StateDirLock::Acquire(state_, "x:1");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr(absl::StrCat("(pid ", child, " on host ")));
  ASSERT_EQ(kill(child, SIGKILL), 0);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);
  reaper.pid = -1;
  absl::StatusOr<std::string> stale = io::ReadFile(LockFile());
  ASSERT_TRUE(stale.ok());
  EXPECT_THAT(*stale, HasSubstr(absl::StrCat("pid ", child, "\n")));  // still names the dead one.
  absl::StatusOr<std::unique_ptr<StateDirLock>> taken = StateDirLock::Acquire(state_, "x:1");
  ASSERT_TRUE(taken.ok()) << taken.status();
  absl::StatusOr<std::string> record = io::ReadFile(LockFile());
  ASSERT_TRUE(record.ok());
  EXPECT_THAT(*record, HasSubstr(absl::StrCat("pid ", getpid(), "\n")));
}

// A lock file whose holder never recorded itself (or wrote something else) is shown as such.
TEST_F(StateDirLockTest, AnUnreadableHolderIsSaidSo) {
  absl::StatusOr<std::unique_ptr<StateDirLock>> first = StateDirLock::Acquire(state_, "a:1");
  ASSERT_TRUE(first.ok()) << first.status();
  std::ofstream(LockFile(), std::ios::trunc) << "";
  absl::StatusOr<std::unique_ptr<StateDirLock>> second = StateDirLock::Acquire(state_, "b:1");
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.status().message(),
              HasSubstr("another coordinator (its holder has not recorded itself yet; lock file"));
}

TEST_F(StateDirLockTest, BadPathsAreRefused) {
  EXPECT_EQ(StateDirLock::Acquire("", "a:1").status().code(), absl::StatusCode::kInvalidArgument);
  std::ofstream(dir_ + "/file") << "not a directory";
  EXPECT_EQ(StateDirLock::Acquire(dir_ + "/file", "a:1").status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace pipetrain::coordinator
