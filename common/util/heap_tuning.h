// Process-wide glibc malloc settings for processes that move or compute on multi-MiB buffers.
//
// glibc serves an allocation above its mmap threshold (128 KiB at start, raised dynamically up to
// 32 MiB) with a fresh mmap, and returns heap memory above its trim threshold to the kernel on
// free. Either way the next buffer of that size is new memory: every 4 KiB page faults and is
// zeroed by the kernel on first touch. Two hot paths allocate such buffers per call: gRPC's
// receive slices, and Eigen's GEMM packing buffers (allocated per product of the Linear layers,
// sized by the blocking of math::PinEigenBlockingForReproducibility). Without this the
// single-process reference trainer spent ~40% of a deep-MLP step in page faults and in touching
// fresh packing buffers (docs/performance.md, "The oracle's speed").
#ifndef PIPETRAIN_COMMON_UTIL_HEAP_TUNING_H_
#define PIPETRAIN_COMMON_UTIL_HEAP_TUNING_H_

#include "absl/status/status.h"

namespace pipetrain::util {

// True when a sanitizer's allocator (ASan, TSan, MSan) replaces glibc's malloc: it has no such
// settings and its own reuse policy, so there is nothing to tune.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitizerAllocator = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || \
    __has_feature(memory_sanitizer)
inline constexpr bool kSanitizerAllocator = true;
#else
inline constexpr bool kSanitizerAllocator = false;
#endif
#else
inline constexpr bool kSanitizerAllocator = false;
#endif

// Largest allocation still served from the heap after KeepLargeBuffersOnHeap (64 MiB).
inline constexpr int kHeapMmapThresholdBytes = 64 << 20;
// Free memory at the top of the heap kept instead of returned to the kernel (1 GiB).
inline constexpr int kHeapTrimThresholdBytes = 1 << 30;

// Serves allocations up to kHeapMmapThresholdBytes from the heap and keeps up to
// kHeapTrimThresholdBytes of freed memory mapped, so buffers freed and allocated again per
// operation reuse touched pages. Does not change any computed value. Call once at the start of
// main(), before other threads run; process-wide, not thread-safe. INTERNAL if glibc refuses a
// setting (then the defaults stay in force, which is slower but correct). With a sanitizer's
// allocator (kSanitizerAllocator) it does nothing and returns OK.
absl::Status KeepLargeBuffersOnHeap();

// Returns the free memory of every malloc arena to the kernel (malloc_trim): what
// KeepLargeBuffersOnHeap keeps mapped for reuse within a job is given back when a job ends, so a
// long-lived daemon's resident size follows the job it runs, not the largest it ever ran (nor the
// free holes its threads' arenas collect over many jobs). Thread-safe; a few milliseconds at most.
// Does nothing with a sanitizer's allocator.
void ReturnFreeHeapToKernel();

}  // namespace pipetrain::util

#endif  // PIPETRAIN_COMMON_UTIL_HEAP_TUNING_H_
