#include "common/util/lock_checks.h"

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace pipetrain::util {
namespace {

// Locks `a` then `b`, then `b` then `a`: a lock-order cycle (which never deadlocks here, one
// thread does both), the pattern Abseil's checks abort on when they are on.
void TakeInBothOrders(absl::Mutex& a, absl::Mutex& b) {
  {
    absl::MutexLock la(&a);
    absl::MutexLock lb(&b);
  }
  {
    absl::MutexLock lb(&b);
    absl::MutexLock la(&a);
  }
}

TEST(LockChecksTest, ReleaseBinariesDoNotAbortOnALockOrderCycle) {
  if (!kLockChecksOffInThisBuild) GTEST_SKIP() << "a debug build keeps Abseil's checks";
  ConfigureLockChecks();
  absl::Mutex a, b;
  TakeInBothOrders(a, b);  // with the checks on (Debian's Abseil), the process would die here.
  SUCCEED();
}

TEST(LockChecksTest, ADebugBuildKeepsTheChecks) {
  if (kLockChecksOffInThisBuild) GTEST_SKIP() << "a Release build turns them off";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  absl::Mutex a, b;
  EXPECT_DEATH(
      {
        ConfigureLockChecks();
        TakeInBothOrders(a, b);
      },
      "potential deadlock");
}

}  // namespace
}  // namespace pipetrain::util
