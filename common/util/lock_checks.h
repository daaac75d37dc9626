// Abseil's lock-order ("deadlock") checking for a whole process.
//
// absl::Mutex can record, on every acquisition, which locks the thread already holds and check
// the resulting lock-order graph for cycles. Abseil enables this unless Abseil itself was built
// with NDEBUG — and Debian builds it without — so by default every Mutex acquisition in our
// binaries paid for the graph bookkeeping (about 6% of the coordinator's CPU in a training step),
// and a lock-order cycle, even one that never deadlocked, would abort the process.
#ifndef PIPETRAIN_COMMON_UTIL_LOCK_CHECKS_H_
#define PIPETRAIN_COMMON_UTIL_LOCK_CHECKS_H_

namespace pipetrain::util {

// Whether ConfigureLockChecks() turns the checks off: in builds with NDEBUG (Release).
#ifdef NDEBUG
inline constexpr bool kLockChecksOffInThisBuild = true;
#else
inline constexpr bool kLockChecksOffInThisBuild = false;
#endif

// For the main() of a binary, before other threads run: in a Release build (NDEBUG), no
// lock-order checking; otherwise Abseil's default stays (report the cycle and abort). Unit
// tests do not call it, so the in-process tests still check every lock order they exercise.
void ConfigureLockChecks();

}  // namespace pipetrain::util

#endif  // PIPETRAIN_COMMON_UTIL_LOCK_CHECKS_H_
