#include "common/util/lock_checks.h"

#include "absl/synchronization/mutex.h"

namespace pipetrain::util {

void ConfigureLockChecks() {
  if (kLockChecksOffInThisBuild) {
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  }
}

}  // namespace pipetrain::util
