#include "common/util/heap_tuning.h"

#include <sys/resource.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "gtest/gtest.h"

namespace pipetrain::util {
namespace {

int64_t MinorFaults() {
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

// Allocates `bytes`, writes every byte and frees it, `rounds` times; returns the minor page
// faults the last round took.
int64_t FaultsOfLastRound(size_t bytes, int rounds) {
  int64_t faults = 0;
  for (int i = 0; i < rounds; ++i) {
    const int64_t before = MinorFaults();
    void* p = std::malloc(bytes);
    if (p == nullptr) return -1;
    // The barriers keep the compiler from eliding malloc, memset and free as a whole.
    asm volatile("" : : "g"(p) : "memory");
    std::memset(p, i + 1, bytes);
    asm volatile("" : : "g"(p) : "memory");
    std::free(p);
    faults = MinorFaults() - before;
  }
  return faults;
}

TEST(HeapTuningTest, ReusedLargeBuffersDoNotFaultAgain) {
  if (kSanitizerAllocator) {
    GTEST_SKIP() << "a sanitizer's allocator replaces glibc's: there is nothing to tune";
  }
  ASSERT_TRUE(KeepLargeBuffersOnHeap().ok());
  // 12288 pages of 4 KiB: above the largest mmap threshold glibc's defaults ever reach (32 MiB),
  // so without the call every round is a fresh mmap that faults on every page.
  constexpr size_t kBytes = size_t{48} << 20;
  // The first round grows the heap (faults); later rounds reuse the same pages.
  const int64_t faults = FaultsOfLastRound(kBytes, 4);
  ASSERT_GE(faults, 0) << "malloc of 48 MiB failed";
  EXPECT_LT(faults, 64) << "a 48 MiB buffer freed and allocated again faulted " << faults
                        << " times";
}

TEST(HeapTuningTest, FreedMemoryGoesBackToTheKernelWhenAsked) {
  if (kSanitizerAllocator) {
    GTEST_SKIP() << "a sanitizer's allocator replaces glibc's: there is nothing to return";
  }
  ASSERT_TRUE(KeepLargeBuffersOnHeap().ok());
  constexpr size_t kBytes = size_t{48} << 20;
  ASSERT_GE(FaultsOfLastRound(kBytes, 1), 0) << "malloc of 48 MiB failed";
  // Kept: allocating it again touches no new page.
  EXPECT_LT(FaultsOfLastRound(kBytes, 1), 64);
  ReturnFreeHeapToKernel();
  // Returned: every page of the next allocation is new (faults on first touch).
  const int64_t faults = FaultsOfLastRound(kBytes, 1);
  EXPECT_GT(faults, static_cast<int64_t>(kBytes / 4096 / 2))
      << "after ReturnFreeHeapToKernel a 48 MiB buffer faulted only " << faults << " times";
}

TEST(HeapTuningTest, IsIdempotent) {
  EXPECT_TRUE(KeepLargeBuffersOnHeap().ok());
  EXPECT_TRUE(KeepLargeBuffersOnHeap().ok());
}

}  // namespace
}  // namespace pipetrain::util
